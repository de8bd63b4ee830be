//! The model API: load, inspect, edit and save calibrated ONNX models.
