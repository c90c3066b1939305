"""app's capture of W&B metrics; sitecustomize.py says how it is reached."""
