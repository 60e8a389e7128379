#!/usr/bin/env python3
"""Runs the ONNX models that kiln exports in onnxruntime and compares their outputs
with kiln's.

    run_onnxruntime.py EXPORTER CASES_DIR VENV_DIR

EXPORTER is the test executable holding the case "the examples' graphs run in
onnxruntime"; run with $KILN_ONNX_CASES_DIR set, it writes each model with its input
sets and kiln's outputs, in ONNX's test-data layout, under CASES_DIR. Each model is
checked by ONNX's checker (with shape inference), then run by onnxruntime on every
input set: integer, bool and string outputs must be equal, floating-point ones within
1e-5 relative and 1e-6 absolute (onnxruntime's kernels round differently). Each model
comes at both ends of the opsets kiln writes (model.onnx at the newest, the default,
and model_opset<N>.onnx at the oldest), and each must declare the IR version that ONNX
pairs with its opset.

onnx, onnxruntime and numpy come from PyPI: when this Python lacks them, they are
installed into a virtual environment at VENV_DIR (made once), and the script runs
again from there.
"""

import os
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from python_packages import ensure_packages  # noqa: E402

PACKAGES = ["onnx", "onnxruntime", "numpy"]


def main() -> int:
    exporter, cases_dir, venv = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
    ensure_packages(venv, PACKAGES)
    import numpy as np
    import onnx
    import onnx.numpy_helper
    import onnxruntime

    cases_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run([exporter, "the examples' graphs run in onnxruntime"], check=True,
                   env={**os.environ, "KILN_ONNX_CASES_DIR": str(cases_dir)}, stdout=subprocess.DEVNULL)

    def load(path: pathlib.Path):
        return onnx.numpy_helper.to_array(onnx.load_tensor(str(path)))

    cases = sorted(p for p in cases_dir.iterdir() if (p / "model.onnx").exists())
    if not cases:
        print("no models were exported under %s" % cases_dir)
        return 1
    def session_of(model):
        return onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

    failures = 0
    runs = []
    for case in cases:
        for path in sorted(case.glob("model*.onnx")):
            model = onnx.load(str(path))
            onnx.checker.check_model(model, full_check=True)
            opset = model.opset_import[0].version
            # The IR version ONNX's releases pair with this opset.
            ir = max(v[1] for v in onnx.helper.VERSION_TABLE if v[2] <= opset)
            if model.ir_version != ir:
                print("%s: IR version %d, opset %d goes with %d" % (path, model.ir_version, opset, ir))
                failures += 1
            runs.append((case, "opset %d" % opset, session_of(model)))
    for case, opset, session in runs:
        names = [i.name for i in session.get_inputs()]
        for data in sorted(case.glob("test_data_set_*")):
            inputs = [load(data / ("input_%d.pb" % k)) for k in range(len(names))]
            expected = [load(p) for p in sorted(data.glob("output_*.pb"), key=lambda p: int(p.stem.split("_")[1]))]
            got = session.run(None, dict(zip(names, inputs)))
            problems = []
            if len(got) != len(expected):
                problems.append("%d outputs, kiln gives %d" % (len(got), len(expected)))
            for k, (g, e) in enumerate(zip(got, expected)):
                g = np.asarray(g)
                if g.shape != e.shape or g.dtype != e.dtype:
                    problems.append("output %d: %s %s, kiln gives %s %s" % (k, g.dtype, g.shape, e.dtype, e.shape))
                elif e.dtype.kind == "f":
                    if not np.allclose(g, e, rtol=1e-5, atol=1e-6, equal_nan=True):
                        problems.append("output %d differs by up to %g" % (k, np.max(np.abs(g - e))))
                elif not np.array_equal(g, e):
                    problems.append("output %d: %s, kiln gives %s" % (k, g.tolist(), e.tolist()))
            status = "ok" if not problems else "FAILED: " + "; ".join(problems)
            print("%s/%s, %s: %s" % (case.name, data.name, opset, status))
            failures += bool(problems)
    print("%d models, %d runs failed (onnxruntime %s, onnx %s)" %
          (len(cases), failures, onnxruntime.__version__, onnx.__version__))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
