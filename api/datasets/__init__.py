"""Datasets: uploads validated and stored under ``DATA_DIR/datasets/<id>.jsonl``."""
