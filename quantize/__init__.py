"""edged.quantize: offline model tools, never imported by the device runtime.

frames.py   calibration / evaluation frames (images or video) with their ground truth
int8.py     ONNX -> INT8 QDQ (ONNX Runtime's quantizer) with heads in float and a float-block search;
            ONNX -> FP16
report.py   the accuracy report and gate, through the daemon's preprocessing and decoders
tool.py     `edged quantize`: source model + frames -> gated package
qdq.py      `build-engine --calib`: float model + frames -> a Q/DQ model for TensorRT, checked against the
            float model on those frames (every TensorRT version; TensorRT's calibrator is not used)
folding.py  `--fold` for both: the preprocessing folded into the float model first (models/fold.py, checked on
            values against the unfolded model), so calibration and the gate feed uint8 rows
engine.py   `edged build-engine`: ONNX -> TensorRT engine package (the builder is edged.daemon.backends.tensorrt.build)
"""
