"""Operations: planning a grid's compute (plan), the benchmark (bench), the CUDA checks (gpucheck) and which GPU a
job trains on (slots)."""
