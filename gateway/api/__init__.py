"""The Gateway's HTTP APIs: worker (mTLS), operator (API keys), service endpoints."""
