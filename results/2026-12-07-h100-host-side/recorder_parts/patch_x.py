"""Device-only experiment switches (never committed): X_PART=noread|nowrite|noloss in bench child processes."""

import sys

site = sys.argv[1]
b = open("bench/sdk_overhead.py").read()
b = b.replace("*((BEFORE,) if args.before else ())", '*(("x_noread", "x_nowrite", "x_noloss") if args.before else ())')
b = b.replace(
    "choices=(*MODES, BEFORE, *KERNELS)", 'choices=(*MODES, BEFORE, "x_noread", "x_nowrite", "x_noloss", *KERNELS)'
)
b = b.replace(
    "        if args.mode == BEFORE:\n            os.environ.update(BEFORE_ENV)",
    '        if args.mode.startswith("x_"):\n            os.environ["X_PART"] = args.mode[2:]',
)
b = b.replace(
    'if result["steps_recorded"] not in (None, result["steps"]):',
    'if result["steps_recorded"] not in (None, result["steps"]) and not mode.startswith("x_n"):',
)
assert 'x_n")' in b
assert b.count("x_noread") == 2 and 'os.environ["X_PART"]' in b
open("bench/sdk_overhead.py", "w").write(b)
s = open(f"{site}/detlab/sdk/spool.py").read()
s = s.replace(
    "                if self._error is None:\n                    record = job()",
    "                if __import__('os').environ.get('X_PART') == 'noread':\n                    continue\n"
    "                if self._error is None:\n                    record = job()\n"
    "                    if __import__('os').environ.get('X_PART') == 'nowrite':\n                        continue",
)
assert "noread" in s and "nowrite" in s
open(f"{site}/detlab/sdk/spool.py", "w").write(s)
r = open(f"{site}/detlab/sdk/recorder.py").read()
head = "    def step(self, step: int, model: torch.nn.Module, *, loss: Any = None, batch: Any = None) -> None:\n"
i = r.index(head)
j = r.index('"""', r.index('"""', i) + 3) + 3
r = r[:j] + "\n        if __import__('os').environ.get('X_PART') == 'noloss':\n            loss = None" + r[j:]
open(f"{site}/detlab/sdk/recorder.py", "w").write(r)
print("patched")
