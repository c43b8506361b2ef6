# One Dockerfile, two images, chosen with --target:
#   docker build --target manager -t <registry>/redline:<tag> .
#   docker build --target sidecar -t <registry>/redline-sidecar:<tag> .
# Static binaries on distroless, non-root: the sidecar runs next to every application pod.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY internal/ internal/
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/manager ./cmd/manager && \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/sidecar ./cmd/sidecar

FROM gcr.io/distroless/static:nonroot AS sidecar
COPY --from=build /out/sidecar /sidecar
USER 65532:65532
ENTRYPOINT ["/sidecar"]

FROM gcr.io/distroless/static:nonroot AS manager
COPY --from=build /out/manager /manager
USER 65532:65532
ENTRYPOINT ["/manager"]
