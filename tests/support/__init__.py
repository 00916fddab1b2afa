"""What the tests share beyond fixtures: the in-process generation stack, the scheduler's simulator and
its traces, whole-stream reads. The benchmarks import it too (`bench/benchutil.py` puts the repository
on their path); nothing here imports a benchmark (`tests/unit/test_layers.py`)."""
