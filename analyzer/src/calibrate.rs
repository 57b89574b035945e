//! Statistical calibration of `theta_slow` from recorded clean runs.
