"""What an image is, decided before any engine is touched: its identity (identity.py: names, tags, the digest of what
it holds), the BuildPlan (render.py: Resolved -> the Dockerfile and the context files; dockerfile.py: the Dockerfile
vocabulary its templates write in), the manifest the image carries (manifest.py), the launch lines of its jobs
(launch.py), its SBOM (sbom.py) and where its recipe came from (provenance.py)."""
