"""Device-only: modes default_new / no_drift_new run with PYTHONPATH=/tmp/site_new (the candidate), the rest with
/tmp/site (main)."""
b = open("bench/sdk_overhead.py").read()
b = b.replace('MODES = ("none", "default", "no_drift")',
              'MODES = ("none", "default", "no_drift", "default_new", "no_drift_new")')
b = b.replace('                done = subprocess.run(cmd, capture_output=True, text=True)',
              '                env = dict(os.environ)\n'
              '                if mode.endswith("_new"):\n'
              '                    env["PYTHONPATH"] = env["PYTHONPATH"].replace("/tmp/site:", "/tmp/site_new:")\n'
              '                done = subprocess.run(cmd, capture_output=True, text=True, env=env)')
b = b.replace('    rec: Any = None\n',
              '    rec: Any = None\n'
              '    import detlab as _d; print("detlab from", _d.__file__, file=sys.stderr)\n'
              '    args.mode = args.mode.removesuffix("_new")\n', 1)
assert b.count("_new") >= 5
open("bench/sdk_overhead.py", "w").write(b)
print("patched")
