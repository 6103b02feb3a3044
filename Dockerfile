# baton in an image with nothing else in it: a static binary (CGO_ENABLED=0),
# built on the host by scripts/compose-up before `docker build`, so nothing
# is pulled from a registry. BATON_BINARY is the stack's binary
# ($BATON_COMPOSE_DIR/baton, scripts/compose-env).
FROM scratch
ARG BATON_BINARY=.docker/baton
COPY ${BATON_BINARY} /baton
ENTRYPOINT ["/baton"]
