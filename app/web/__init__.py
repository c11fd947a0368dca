"""What the API and the console share: request dependencies, the error mapping, request
schemas, routing, admission, the HTTP server. Below both; imports neither."""
