"""Generated modules of the kubelet gRPC APIs (scripts/gen-protos.sh); the .proto files are the source."""
