#!/bin/bash
# The image's HEALTHCHECK: GET /healthz from the local `delayq serve`, with bash's /dev/tcp
# (bash is part of the Debian base image; the image carries no curl or wget for this).
# Exit 0 on a 200 answer, 1 otherwise. The port is HEALTHCHECK_PORT (default 7070, the
# image's listen port). A `delayq healthcheck` verb would replace this script.
set -u
port=${HEALTHCHECK_PORT:-7070}
{ exec 3<>"/dev/tcp/127.0.0.1/${port}"; } 2>/dev/null || { echo "healthz: nothing listens on ${port}"; exit 1; }
printf 'GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n' >&3
IFS= read -r -t 2 status <&3 || { echo "healthz: no answer"; exit 1; }
status=${status%$'\r'}
case $status in
  "HTTP/1."?" 200"*) echo "healthz: ${status}"; exit 0 ;;
  *) echo "healthz: ${status}"; exit 1 ;;
esac
