"""What evals and data teams read from a finished run: pass@k reports (report.py, evals.py),
corpora (corpus.py), and re-scoring from the records alone (rescore.py)."""
