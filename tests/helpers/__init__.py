"""Code shared by tests in several folders: paths of the repository, running a coroutine
with a deadline, reading a run's events, free ports, and watching child processes.

Fixtures that build on these (``scenario_of``, ``tls_files``) are in ``tests/conftest.py``.
"""
