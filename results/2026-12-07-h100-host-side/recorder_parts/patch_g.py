"""Device-only (never committed): GpuWork variants x_gev (graph + 2 blocking events a step) and x_gevloss (+ the
loss's pinned copy), each kept alive 3 steps as the recorder's writer would, nothing read."""

b = open("bench/sdk_overhead.py").read()
b = b.replace(
    "*((BEFORE,) if args.before else ())", '*(("gpu_fingerprint", "x_gev", "x_gevloss") if args.before else ())'
)
b = b.replace("choices=(*MODES, BEFORE, *KERNELS)", 'choices=(*MODES, BEFORE, "x_gev", "x_gevloss", *KERNELS)')
b = b.replace(
    "    if args.mode in KERNELS:\n        rec = GpuWork(model, args.mode)",
    '    if args.mode in KERNELS or args.mode.startswith("x_g"):\n'
    '        rec = GpuWork(model, "gpu_fingerprint" if args.mode.startswith("x_g") else args.mode)\n'
    "        rec.extra = args.mode",
)
b = b.replace(
    "    def step(self, step: int, model: Any, loss: Any = None) -> None:\n        self._run()",
    '    extra = ""\n    kept: list = []\n\n'
    "    def step(self, step: int, model: Any, loss: Any = None) -> None:\n        self._run()\n"
    "        from detlab.tensors.digests import read_scalar, recorded_event\n"
    '        if self.extra in ("x_gev", "x_gevloss"):\n'
    "            self.kept = self.kept[-4:] + [recorded_event()]\n"
    '        if self.extra == "x_gevloss":\n'
    "            self.kept.append(read_scalar(loss))\n"
    '        elif self.extra == "x_gev":\n'
    "            self.kept.append(recorded_event())",
)
assert b.count("x_gevloss") >= 4, b.count("x_gevloss")
open("bench/sdk_overhead.py", "w").write(b)
print("patched")
