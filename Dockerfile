# baton in an image with nothing else in it: a static binary (CGO_ENABLED=0),
# built on the host by scripts/compose-up before `docker build`, so nothing
# is pulled from a registry.
FROM scratch
COPY .docker/baton /baton
ENTRYPOINT ["/baton"]
