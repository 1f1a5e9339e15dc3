# shellcheck shell=sh
# Installed as /etc/profile.d/zz-container-env.sh - sourced by login shells (SSH, Jupyter terminals).
#
# entrypoint.sh saves the container's environment (PATH, LD_LIBRARY_PATH,
# CUDA/NVIDIA/TF variables, PIP_CONSTRAINT, variables passed with -e) at
# start-up.  sshd already applies it to every session (SetEnv, root-owned include),
# but Debian's /etc/profile resets PATH for login shells, so re-apply it here.
# Lines are NAME=value, one per line, no quoting (sshd's format).
#
# Its PATH is the container's.  A user's login shell then puts ~/.local/bin first, where
# `pip install --user` puts its commands, as the user's other sessions have it (entrypoint.sh,
# user_path); root's never: a folder the user can write on root's PATH would run the user's
# `ls` as root in an admin's `docker exec C bash -l`.
if [ -r /etc/tfmp/container.env ]; then
    while IFS= read -r _tfmp_line || [ -n "$_tfmp_line" ]; do
        case "$_tfmp_line" in
            '' | '#'*) continue ;;
        esac
        export "${_tfmp_line?}"
    done </etc/tfmp/container.env
    unset _tfmp_line
fi
# The start-up secrets `docker exec` still carries (entrypoint.sh, save_private_names).
# shellcheck source=/dev/null
if [ -r /etc/tfmp/unset-private.sh ]; then
    . /etc/tfmp/unset-private.sh
fi
if [ "$(id -u)" != 0 ] && [ -n "${HOME-}" ] && [ "$HOME" != / ]; then
    case ":$PATH:" in
        *":$HOME/.local/bin:"*) ;;
        *) PATH="$HOME/.local/bin:$PATH" ;;
    esac
    export PATH
fi
