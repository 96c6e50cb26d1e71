"""Facts every part of the project shares and none owns: where the project's files are
(paths.py), a run folder's layout (run_dir.py), what a tool's schema admits (toolschema.py).
Depends on nothing else of the project."""
