"""Local training loops shared by every client algorithm."""
