# Ferry's node services on every Nomad client: the checkpointer and the migrator.
#
#   nomad var put nomad/jobs/ferry-node \
#     store_url='s3://ferry-checkpoints?endpoint=minio.example.internal:9000&secure=0' \
#     s3_access_key=ferry s3_secret_key=...
#   ferry keys secret ./keys --format nomad | nomad var put -in json nomad/jobs/ferry-node/keys -
#   nomad job run deploy/nomad/ferry-node.nomad.hcl
#
# (./keys: what `ferry keys init` made for ferry.nomad.hcl.) The task renders its items into its
# secrets/ folder: each service's NATS user, the store's keyring, the key that opens jobs'
# environments, the TLS of the page server of live moves.
#
# A system job: one allocation per eligible client (restrict it with a constraint, e.g. on
# ${meta.ferry_node}). Driver: privileged docker with the image of deploy/Dockerfile, which brings
# CRIU 4.1. The docker plugin on each client must allow it:
#   plugin "docker" { config { allow_privileged = true  volumes { enabled = true } } }
#
# The same assumptions as deploy/kubernetes/node.yaml (read its header), in short:
# - privileged + pid_mode "host": CRIU needs the capabilities, an unfiltered syscall set and the
#   host's PIDs; the container's /proc is then the host PID namespace's.
# - ONE task runs both services (a small sh supervisor): a workload lives in the mount namespace of
#   the service that started or restored it, and CRIU can only dump it without dumping that
#   namespace when the namespace is CRIU's own, so checkpointer and migrator share one container.
# - /var/lib/ferry is bind-mounted at the same path; the image is the same everywhere (pin a digest);
#   workload programs and data sit at the same paths on every client.
# - Workloads share the task's cgroup: docker's memory limit covers them. Enable memory
#   oversubscription (nomad operator scheduler set-config -memory-oversubscription=true) so that
#   memory_max below applies, or raise memory to what Ferry may place on a client. They die with
#   the task; Ferry restores them from their last checkpoint. Migrate jobs off before stopping it.
# - The prestart task raises fs.pipe-max-size to 16 MiB on the host (post-copy needs it).
# The alternative is raw_exec as root with Ferry installed on the host by ./setup.sh: then both
# services may be two tasks, since raw_exec tasks share the host's mount namespace.

locals {
  image = "ghcr.io/ferry-project/ferry:0.1.0"

  # Runs the checkpointer and the migrator side by side (the same script as node.yaml).
  node_script = <<-EOS
  FERRY_NODE_ID=$(printf %s "$FERRY_NODE_ID" | tr -c 'A-Za-z0-9_-' '-')
  export FERRY_NODE_ID
  supervise() {  # runs "$@", again after a pause whenever it dies, until SIGTERM
    stop=0
    child=
    trap 'stop=1; [ -z "$child" ] || kill -TERM "$child" 2>/dev/null' TERM
    while [ "$stop" = 0 ]; do
      "$@" &
      child=$!
      rc=0
      wait "$child" || rc=$?
      while kill -0 "$child" 2>/dev/null; do wait "$child" || rc=$?; done
      [ "$stop" = 0 ] || break
      echo "ferry-node: '$*' exited with status $rc; restarting it in 5 s" >&2
      sleep 5
    done
  }
  supervise env FERRY_NATS_CREDS="$KEYS_DIR/nats-checkpointer.json" python -m ferry.checkpointer &
  checkpointer=$!
  supervise env FERRY_NATS_CREDS="$KEYS_DIR/nats-migrator.json" python -m ferry.migrator &
  migrator=$!
  trap 'kill -TERM "$checkpointer" "$migrator" 2>/dev/null' TERM INT
  while kill -0 "$checkpointer" 2>/dev/null || kill -0 "$migrator" 2>/dev/null; do
    wait || true
  done
  EOS

  # Post-copy needs pipes of 16 MiB; fs.* sysctls are host-wide. Raises, never lowers.
  sysctl_script = <<-EOS
  want=16777216
  have=$(cat /proc/sys/fs/pipe-max-size)
  if [ "$have" -lt "$want" ]; then echo "$want" > /proc/sys/fs/pipe-max-size; fi
  EOS
}

job "ferry-node" {
  type = "system"

  group "node" {
    restart {
      attempts = 10
      interval = "10m"
      delay    = "10s"
      mode     = "delay"
    }

    task "sysctl" {
      driver = "docker"

      lifecycle {
        hook    = "prestart"
        sidecar = false
      }

      config {
        image      = local.image
        privileged = true
        command    = "/bin/sh"
        args       = ["-c", local.sysctl_script]
      }

      resources {
        cpu    = 50
        memory = 64
      }
    }

    task "node" {
      driver       = "docker"
      kill_signal  = "SIGTERM"
      kill_timeout = "60s" # longer than drain_timeout_s

      config {
        image      = local.image
        privileged = true
        pid_mode   = "host"
        command    = "/bin/sh"
        args       = ["-c", local.node_script]
        volumes    = ["/var/lib/ferry:/var/lib/ferry"]
      }

      env {
        FERRY_CONFIG         = "/local/ferry.yaml"
        FERRY_NODE_ID        = "${node.unique.name}"
        FERRY_DATA_DIR       = "/var/lib/ferry"
        KEYS_DIR             = "/secrets"
        FERRY_STORE_KEY_FILE = "/secrets/store.keys"
        FERRY_ENV_KEY_FILE   = "/secrets/env.key"
        FERRY_PAGE_TLS_CERT  = "/secrets/tls-server.pem"
        FERRY_PAGE_TLS_KEY   = "/secrets/tls-server.key"
        FERRY_PAGE_TLS_CA    = "/secrets/tls-ca.pem"
      }

      template {
        destination = "secrets/nats-checkpointer.json"
        perms       = "0400"
        change_mode = "noop"
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/ferry-node/keys" }}{{ index . "nats-checkpointer.json" }}{{ end }}
        EOT
      }

      template {
        destination = "secrets/nats-migrator.json"
        perms       = "0400"
        change_mode = "noop"
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/ferry-node/keys" }}{{ index . "nats-migrator.json" }}{{ end }}
        EOT
      }

      template {
        destination = "secrets/store.keys"
        perms       = "0400"
        change_mode = "noop"
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/ferry-node/keys" }}{{ index . "store.keys" }}{{ end }}
        EOT
      }

      template {
        destination = "secrets/env.key"
        perms       = "0400"
        change_mode = "noop"
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/ferry-node/keys" }}{{ index . "env.key" }}{{ end }}
        EOT
      }

      template {
        destination = "secrets/tls-ca.pem"
        perms       = "0400"
        change_mode = "noop"
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/ferry-node/keys" }}{{ index . "tls-ca.pem" }}{{ end }}
        EOT
      }

      template {
        destination = "secrets/tls-server.pem"
        perms       = "0400"
        change_mode = "noop"
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/ferry-node/keys" }}{{ index . "tls-server.pem" }}{{ end }}
        EOT
      }

      template {
        destination = "secrets/tls-server.key"
        perms       = "0400"
        change_mode = "noop"
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/ferry-node/keys" }}{{ index . "tls-server.key" }}{{ end }}
        EOT
      }


      template {
        destination = "local/ferry.yaml"
        change_mode = "noop" # a restart kills the workloads: restart by hand after moving them
        data        = <<-EOT
        nats_url: "{{ range $i, $s := nomadService "nats" }}{{ if $i }},{{ end }}tls://{{ $s.Address }}:{{ $s.Port }}{{ end }}"
        nats_ca: /secrets/tls-ca.pem
        nats_replicas: 3
        data_dir: /var/lib/ferry
        heartbeat_interval_s: 1.0
        heartbeat_timeout_s: 5.0
        drain_timeout_s: 20
        otel_exporter: none
        log_level: INFO
        EOT
      }

      template {
        destination = "secrets/ferry.env"
        env         = true
        change_mode = "noop"
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/ferry-node" }}
        FERRY_STORE_URL="{{ .store_url }}"
        FERRY_S3_ACCESS_KEY="{{ .s3_access_key }}"
        FERRY_S3_SECRET_KEY="{{ .s3_secret_key }}"
        {{ end }}
        EOT
      }

      resources {
        cpu        = 500
        memory     = 1024
        memory_max = 262144
      }
    }
  }
}
