# Mixed-precision TensorFlow training image: JupyterLab and the Notebook interface on
# 8888, sshd on 22, batch jobs (`docker run IMAGE tfmp train ...`).  See docs/image.md.
#
# Build (BuildKit is required for the optional CA secret):
#   docker compose build
#   docker build -t tfmp/train:dev .                       # with buildx
#   docker build --build-arg PIP_INDEX_URL=https://mirror.example/simple \
#                --secret id=pip_ca,src=corp-ca.pem .      # proxies / mirrors
ARG BASE_IMAGE=tensorflow/tensorflow:2.9.3-gpu
FROM ${BASE_IMAGE}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# No final non-root USER, on purpose: the container starts as root (the base's
# default) only to remap the user's UID/GID, assemble SSH keys and start sshd,
# which needs root to switch users; entrypoint.sh then drops every user-facing
# process (Jupyter, batch jobs, self-test) to `tf` with setpriv.
# `docker run --user UID:GID` also works (then without SSH).  docs/image.md, "Security".

# --- system packages ---------------------------------------------------------
# CUDA 11.x bases list NVIDIA's apt repository; when its signing key or
# metadata changes, every `apt-get update` fails.  Our apt step must not depend
# on it, so such sources are moved aside (kept in sources.list.d.disabled/).
#   openssh-server  SSH logins (sshd)
#   openssl         JupyterLab over TLS: makes the self-signed certificate and checks a
#                   user's pair (the base has it through ca-certificates; named, not assumed)
#   git             clone and commit from terminals, notebooks and SSH; `pip install git+...`
#   rsync           `rsync -e ssh` to sync code and data (needs rsync on both ends)
#   sudo            only for GRANT_SUDO=yes (docker/start/always/09-rights.sh); without it
#                   no rule names the user, and the user has no password
#   libnss-wrapper  a name and home for a --user UID without a passwd entry (entrypoint.sh,
#                   name_unknown_uid); /etc/passwd stays root's
#   tini            PID 1: reaps zombies, forwards signals (fast `docker stop`)
#   procps          pgrep/ps: a stop sends the user's own jobs SIGTERM before the services
#                   (entrypoint.sh, stop_user_processes); named, not assumed of the base
# Versions come from the base's distribution release, hence no pins.
# hadolint ignore=DL3008
RUN shopt -s nullglob \
 && mkdir -p /etc/apt/sources.list.d.disabled \
 && for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do \
      if grep -qiE 'nvidia|cuda' "$f"; then mv "$f" /etc/apt/sources.list.d.disabled/; fi; \
    done \
 && apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      openssh-server \
      openssl \
      git \
      rsync \
      sudo \
      libnss-wrapper \
      tini \
      procps \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* \
 # sudo's package lets group sudo (and admin) run anything: no group gets a rule here, and
 # a root start refuses an NB_GID that one names (entrypoint.sh, refuse_privileged_gid).
 && sed -i -E '/^[[:space:]]*%(sudo|admin)[[:space:]]/d' /etc/sudoers \
 && visudo -c -q \
 # The package generated host keys: never ship keys shared by every container.
 && rm -f /etc/ssh/ssh_host_*

# --- the unprivileged user ----------------------------------------------------
# UID/GID are remapped at run time from NB_UID/NB_GID (entrypoint.sh).
# Password '*' = no password can match, but the account is not locked.
# SC2016: PROMPT_COMMAND is written literally, for bash to expand.
# hadolint ignore=SC2016
RUN groupadd -o -g 1000 tf \
 && useradd -o -m -u 1000 -g tf -s /bin/bash tf \
 && usermod -p '*' tf \
 && install -d -o tf -g 0 -m 775 /workspace \
 && install -d -o tf -g tf -m 700 /home/tf/.ssh /home/tf/.jupyter \
 && install -d -m 755 /etc/tfmp /etc/ssh/host_keys /etc/ssh/authorized_keys \
 # The image's own files in the home, pristine: /home/tf is a volume that outlives
 # the image, and docker/start/always/07-home.sh adds or refreshes them from here (readable
 # by any NB_UID; folders are created private there).
 && mkdir -p /usr/local/share/tfmp \
 && cp -a /home/tf /usr/local/share/tfmp/home \
 && chown -R root:root /usr/local/share/tfmp/home \
 && chmod -R go-w,a+rX /usr/local/share/tfmp/home \
 # The marker of a home the image made (not in the pristine copy, so never copied into a
 # bind mount): "UID:GID" it was made for.  Docker copies it into a new named volume; the
 # entrypoint re-owns only such a home (entrypoint.sh, fit_home; docs/image.md, "Security").
 && install -d -o tf -g tf -m 755 /home/tf/.local /home/tf/.local/state /home/tf/.local/state/tfmp \
 && echo 1000:0 >/home/tf/.local/state/tfmp/home-owner \
 # The image's home (and workspace, above) belong to group 0 and that group may write them,
 # as OpenShift's arbitrary UIDs need (--user UID:0: GID 0, no passwd entry); a root start
 # gives the home to NB_GID at its first start (fit_home: the marker says 1000:0).
 && chown -R tf:0 /home/tf \
 && chmod -R g=u /home/tf \
 # Shell history written at every prompt: a terminal killed with its container keeps it.
 && printf '%s\n' '' '# tfmp: history survives a container stopped with the shell open' \
      'PROMPT_COMMAND="history -a${PROMPT_COMMAND:+; $PROMPT_COMMAND}"' >>/etc/bash.bashrc \
 # JUPYTER_TLS=self-signed keeps its certificate and key here (a volume, like the host keys).
 && install -d -m 700 /etc/tfmp/tls \
 # Service list for the healthcheck; writable by a non-root start (--user) too.
 && install -d -m 1777 /run/tfmp

# --- Python packages ------------------------------------------------------------
# Resolved against the constraints that keep TF 2.9 working; the same file is
# exported as PIP_CONSTRAINT below for users' own `pip install`.
# Build options: PIP_INDEX_URL / PIP_EXTRA_INDEX_URL / PIP_TRUSTED_HOST build-args
# and an extra CA certificate as the BuildKit secret `pip_ca` (mounted only for
# this RUN, never stored in a layer).
ARG PIP_INDEX_URL=""
ARG PIP_EXTRA_INDEX_URL=""
ARG PIP_TRUSTED_HOST=""
# pip itself is upgraded first (same constraints): TF 2.9-era bases ship an old
# pip (TF's own images pinned pip<20.3, the legacy resolver, which installs
# conflicting versions without a word).  25.0.1 is the last pip for Python 3.8.
ARG PIP_VERSION=25.0.1
COPY docker/build/constraints.txt /etc/tfmp/constraints.txt
COPY docker/build/requirements.txt docker/build/pip-install.sh /tmp/tfmp-build/
RUN --mount=type=secret,id=pip_ca \
    PIP_CONSTRAINT=/etc/tfmp/constraints.txt TFMP_PIP_VERSION="${PIP_VERSION}" \
      /tmp/tfmp-build/pip-install.sh -r /tmp/tfmp-build/requirements.txt \
 && rm -rf /tmp/tfmp-build /root/.cache \
 && python3 -c 'import tensorflow, numpy; assert numpy.__version__ < "2", numpy.__version__' \
 # `import app` from every shell, kernel and job: /opt/tfmp/src on sys.path.
 && python3 -c 'import site; print(site.getsitepackages()[0])' \
      | xargs -I{} sh -c 'echo /opt/tfmp/src > {}/tfmp-app.pth'

# XLA on the GPU (--jit): libdevice and ptxas from the CUDA 11 compiler wheel
# (requirements.txt), linked where TensorFlow 2.9 looks without XLA_FLAGS: its CUDA
# roots (its build's /usr/local/cuda-11.2, then /usr/local/cuda; in the real base the
# second is a link to the first, linked in both all the same) + nvvm/libdevice/, and ptxas
# on PATH first.  The base
# has CUDA's runtime only (no compiler package).  `tfmp env` checks both (docs/image.md).
RUN nvcc_dir="$(python3 -c 'import nvidia.cuda_nvcc as m, os; print(os.path.dirname(m.__file__))' 2>/dev/null \
      || python3 -c 'import site; print(site.getsitepackages()[0] + "/nvidia/cuda_nvcc")')" \
 && test -x "$nvcc_dir/bin/ptxas" && test -s "$nvcc_dir/nvvm/libdevice/libdevice.10.bc" \
 && for root in /usr/local/cuda-11.2 /usr/local/cuda; do \
      mkdir -p "$root/nvvm/libdevice" "$root/bin" \
      && ln -sf "$nvcc_dir/nvvm/libdevice/libdevice.10.bc" "$root/nvvm/libdevice/libdevice.10.bc" \
      && ln -sf "$nvcc_dir/bin/ptxas" "$root/bin/ptxas"; \
    done \
 && ln -sf "$nvcc_dir/bin/ptxas" /usr/local/bin/ptxas \
 && ptxas --version | tail -n 2

# TF_FORCE_GPU_ALLOW_GROWTH: every TensorFlow process (kernels, SSH sessions, batch
# jobs) takes GPU memory as it needs it instead of nearly all of it at start, so a
# notebook kernel leaves room for a `tfmp tune` or a second kernel.  `-e
# TF_FORCE_GPU_ALLOW_GROWTH=false` restores TensorFlow's default (docs/image.md).
ENV PIP_CONSTRAINT=/etc/tfmp/constraints.txt \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    TFMP_WORKSPACE=/workspace \
    TF_FORCE_GPU_ALLOW_GROWTH=true

# --- configuration and start-up ---------------------------------------------------
COPY docker/config/sshd_config /etc/ssh/sshd_config
COPY docker/config/jupyter_server_config.py /etc/jupyter/jupyter_server_config.py
# The login page, with where the token is (loaded by that config).
COPY docker/config/jupyter-templates/ /usr/local/share/tfmp/jupyter-templates/
# Server extension loaded by that config: `sandbox` in the /nbconvert/ pages' CSP.
COPY docker/python/tfmp_nbconvert_csp.py /opt/tfmp/src/tfmp_nbconvert_csp.py
# The identity provider the start names on the server's command line: the token is the
# image's whatever a config file says (docker/python/tfmp_token_auth.py).
COPY docker/python/tfmp_token_auth.py /opt/tfmp/src/tfmp_token_auth.py
# No "news"/update checks: training boxes are often offline; no pop-up over the launcher.
COPY docker/config/jupyterlab-overrides.json /usr/local/share/jupyter/lab/settings/overrides.json
COPY docker/config/profile-container-env.sh /etc/profile.d/zz-container-env.sh
# `tfmp`, the package's command (docker/bin/tfmp): its first line names this
# image's interpreter, as pip's console scripts do.
COPY docker/bin/tfmp /usr/local/bin/tfmp
# `ssh host 'command'`: values sshd's SetEnv cannot carry (a " or #) come from a
# root-owned file that entrypoint.sh writes; bash reads /etc/bash.bashrc when
# sshd starts it (Debian/Ubuntu build it with SSH_SOURCE_BASHRC).  First line,
# before the file's own "not interactive: return".
# The start-up secrets an interactive `docker exec ... bash` still carries are dropped there
# too (docker/start/always/00-environment.sh, save_private_names).
RUN sed -i '1i [ -r /etc/tfmp/unset-private.sh ] && . /etc/tfmp/unset-private.sh' /etc/bash.bashrc \
 && sed -i '1i [ -r /etc/tfmp/ssh-extra-env.sh ] && . /etc/tfmp/ssh-extra-env.sh' /etc/bash.bashrc \
 && sed -i '1i [ -r /etc/profile.d/00-tfmp-nss-wrapper.sh ] && . /etc/profile.d/00-tfmp-nss-wrapper.sh' /etc/bash.bashrc \
 && sed -i "1i #!$(python3 -c 'import sys; print(sys.executable)')" /usr/local/bin/tfmp \
 && chmod 755 /usr/local/bin/tfmp
COPY docker/bin/tfmp-healthcheck /usr/local/bin/tfmp-healthcheck
# The start-up parts' helpers (docker/start/always/05-banner.sh, serve/08-jupyter-tls.sh,
# serve/10-jupyter.sh), and docker-stacks' run-hooks.sh (sourced by entrypoint.sh), with
# docker-stacks' two hook folders, empty (root's: docs/image.md, "Your own start-up hooks").
COPY docker/bin/tfmp-versions docker/bin/tfmp-tls docker/bin/tfmp-jupyter-args docker/bin/run-hooks.sh /usr/local/bin/
RUN install -d -m 755 /usr/local/bin/start-notebook.d /usr/local/bin/before-notebook.d
# A `docker exec` shell of a --user UID without a passwd entry: its name (entrypoint.sh).
COPY docker/config/profile-nss-wrapper.sh /etc/profile.d/00-tfmp-nss-wrapper.sh
# The persistent home's start-up jobs (docker/start/always/07-home.sh).
COPY docker/bin/tfmp-home /usr/local/bin/tfmp-home
# TensorBoard behind JupyterLab's token: the launcher tile's server (jupyter_server_config.py).
COPY docker/bin/tfmp-tensorboard /usr/local/bin/tfmp-tensorboard
COPY docker/config/tensorboard-icon.svg /usr/local/share/tfmp/tensorboard-icon.svg
# The GPU view: JupyterLab's "GPU" tile (jupyter_server_config.py; reads NVML through app/).
COPY docker/bin/tfmp-gpu-view /usr/local/bin/tfmp-gpu-view
COPY docker/config/gpu-icon.svg /usr/local/share/tfmp/gpu-icon.svg
# The start-up core and its parts (sourced in name order; see entrypoint.sh).
COPY docker/start/ /usr/local/lib/tfmp/start/
COPY entrypoint.sh /usr/local/bin/entrypoint.sh

# --- the project's own files, last: an app/ change rebuilds only these layers ----
# Tests ship for `self-test` (tests/image and tests/benchmarks stay out: .dockerignore).
COPY pyproject.toml /opt/tfmp/pyproject.toml
COPY tests /opt/tfmp/tests
COPY app /opt/tfmp/src/app

ARG IMAGE_VERSION=dev
ENV TFMP_IMAGE_VERSION=${IMAGE_VERSION}
LABEL org.opencontainers.image.title="tfmp-train" \
      org.opencontainers.image.description="TensorFlow 2.9 mixed-precision training: JupyterLab, SSH, batch jobs" \
      org.opencontainers.image.version="${IMAGE_VERSION}"

WORKDIR /workspace
EXPOSE 8888 22
# Asks JupyterLab's /api/status (with the token) and sshd's banner.  A short
# interval because Docker 20.10 has no --start-interval and "healthy" should
# come within seconds of start.
HEALTHCHECK --interval=5s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python3", "/usr/local/bin/tfmp-healthcheck"]
ENTRYPOINT ["/usr/bin/tini", "-g", "--", "/usr/local/bin/entrypoint.sh"]
CMD ["serve"]
