"""The operator's kit: a client CLI and a conformance check for any provider.v1 endpoint.

It talks to a provider only through the generated stubs (plus grpc and protobuf), never
through pyrigaud's server code, so it runs from the core install and checks any provider
(pyrigaud on any backend, upstream's Go providers, a new one) the way the manager sees it.
"""
