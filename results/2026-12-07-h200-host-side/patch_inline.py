"""Device-only (a diagnostic, never landed): mode x_inline is drift off, and x_inline_d the default, with the
writer's jobs run on the loop's thread two steps late (so their GPU work is long done), not on the writer thread."""

import detlab.sdk.spool as sp  # the installed package

b = open("bench/sdk_overhead.py").read()
b = b.replace("*((BEFORE,) if args.before else ())", '*(("x_inline", "x_inline_d") if args.before else ())')
b = b.replace("choices=(*MODES, BEFORE, *KERNELS)", 'choices=(*MODES, BEFORE, "x_inline", "x_inline_d", *KERNELS)')
b = b.replace("        if args.mode == BEFORE:\n",
              '        if args.mode.startswith("x_inline"):\n'
              '            os.environ["DETLAB_X_INLINE"] = "1"\n'
              '        if args.mode == BEFORE:\n')
b = b.replace('drift=args.mode != "no_drift")', 'drift=args.mode not in ("no_drift", "x_inline"))')
assert b.count("x_inline") == 6, b.count("x_inline")
open("bench/sdk_overhead.py", "w").write(b)
path = sp.__file__
s = open(path).read()
s = s.replace("    def put(self, job: Job) -> None:\n        self.check()\n",
              "    def put(self, job: Job) -> None:\n        self.check()\n"
              '        if os.environ.get("DETLAB_X_INLINE") == "1":\n'
              "            held = self.__dict__.setdefault('_held', [])\n"
              "            held.append(job)\n"
              "            while len(held) > 2:\n"
              "                self._file.write(held.pop(0)().model_dump_json() + '\\n')\n"
              "                self._file.flush()\n"
              "            return\n")
s = s.replace("    def close(self) -> None:\n",
              "    def close(self) -> None:\n"
              "        for job in self.__dict__.pop('_held', []):\n"
              "            self._file.write(job().model_dump_json() + '\\n')\n"
              "        self._file.flush()\n")
assert s.count("_held") == 2
open(path, "w").write(s)
print("patched", path)
