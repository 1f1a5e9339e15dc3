# shellcheck shell=sh
# Installed as /etc/profile.d/00-tfmp-nss-wrapper.sh, and sourced by /etc/bash.bashrc: a
# shell that `docker exec` starts in a --user container whose UID has no passwd entry gets
# the name and home the entrypoint gave that UID (entrypoint.sh, name_unknown_uid): the
# processes the entrypoint started have them already.
_tfmp_uid=$(id -u)
if [ "$_tfmp_uid" != 0 ] && [ -z "${NSS_WRAPPER_PASSWD-}" ] && [ -r "/run/tfmp/nss-$_tfmp_uid/passwd" ] \
    && ! id -un >/dev/null 2>&1; then
    NSS_WRAPPER_PASSWD=/run/tfmp/nss-$_tfmp_uid/passwd
    NSS_WRAPPER_GROUP=/run/tfmp/nss-$_tfmp_uid/group
    LD_PRELOAD="libnss_wrapper.so${LD_PRELOAD:+ $LD_PRELOAD}"
    export NSS_WRAPPER_PASSWD NSS_WRAPPER_GROUP LD_PRELOAD
    if [ "${HOME:-/}" = / ] && [ -w /home/tf ]; then
        HOME=/home/tf
        export HOME
    fi
fi
unset _tfmp_uid
