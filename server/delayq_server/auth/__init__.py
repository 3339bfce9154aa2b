"""Authentication and authorization: bearer tokens, client certificates, one interceptor."""
