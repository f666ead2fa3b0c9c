#!/usr/bin/env bash
# Makes a stand-in for docker.io/library/debian:bookworm-slim from Debian's own packages
# (no container registry is reachable from CI): debootstrap --variant=minbase, trimmed the
# way the official slim image is (no docs, man pages or locales; apt lists removed), imported
# into Podman and tagged with the name the Dockerfile uses. Reuses the tag when it exists.
#
#   .ci/container/base-image.sh [TAG]     (default docker.io/library/debian:bookworm-slim)
set -euo pipefail

tag=${1:-docker.io/library/debian:bookworm-slim}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
podman=(podman --runtime runc --cgroup-manager=cgroupfs)

if "${podman[@]}" image exists "$tag"; then
  echo "base image: $tag exists, reused"
  exit 0
fi

root=$(mktemp -d /tmp/delayq-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "base image: debootstrap bookworm (minbase) from $mirror"
start=$SECONDS
if ! timeout 600 debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.log" 2>&1; then
  tail -n 30 "$root.log" >&2
  rm -f "$root.log"
  echo "base image: debootstrap failed" >&2
  exit 1
fi
rm -f "$root.log"

# What the official slim variant does: dpkg keeps no docs (but copyrights), man pages,
# info or locales, now and for every later apt-get install; apt keeps no caches.
cat >"$root/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
EOF
cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
echo 'Acquire::Languages "none";' >"$root/etc/apt/apt.conf.d/docker-no-languages"
find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$root"/usr/share/{man,groff,info,lintian,linda,locale}/* \
  "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin \
  "$root"/var/lib/apt/lists/* "$root"/var/log/* "$root"/tmp/* "$root"/root/.cache
# The image's apt sources: the same mirror, with the updates and security suites.
cat >"$root/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb ${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security} bookworm-security main
EOF
: >"$root/etc/hostname"
: >"$root/etc/resolv.conf"

tar -C "$root" --numeric-owner -c . |
  "${podman[@]}" import --quiet --change 'CMD ["bash"]' - "$tag" >/dev/null
echo "base image: $tag made in $((SECONDS - start)) s"
