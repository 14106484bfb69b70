"""The test suite as a package: folders mirror geomx's packages, so a file in one folder
may share its name with a file in another (``sync/test_real.py``, ``sched/test_dgt_real.py``)
and every test can import the shared code as ``tests.helpers``."""
