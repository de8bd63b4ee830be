//! Figures for the debugger: line charts, histograms, box plots. Takes plain series and\n//! statistics, knows nothing of ONNX; renders PNG or SVG with an embedded font.
