"""Calibration: observers, the calibration loop, quantize_model, evaluation."""
