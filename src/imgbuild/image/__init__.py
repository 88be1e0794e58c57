"""What an image is, decided before any engine is touched: the BuildPlan (render.py: the Dockerfile and the
context files), the manifest the image carries, and the launch lines of its jobs (launch.py)."""
