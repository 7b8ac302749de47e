"""spacepool HTTP service (FastAPI): see app.main."""
