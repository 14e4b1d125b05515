# Ferry's control plane: api, scheduler, health, pricing and autoscaler, one of each, in one group.
#
#   ferry keys init ./keys --tls-hosts ferry-api.service.nomad,localhost,127.0.0.1   # once, see below
#   ferry keys token --tokens-file ./keys/tokens.yaml --tenant ops --role admin       # your token
#   ferry keys secret ./keys --format nomad | nomad var put -in json nomad/jobs/ferry/keys -
#   nomad job run deploy/nomad/ferry.nomad.hcl
#
# Credentials: the variable nomad/jobs/ferry/keys holds every file `ferry keys init` made (the
# same items go to nomad/jobs/ferry-node/keys and nomad/jobs/nats/keys, each job reads only its
# own); each task renders the items it needs into its secrets/ folder (0400, its own uid): its
# NATS user, and for the API its TLS certificate, the tokens file and the key environments are
# sealed to.
#
# Driver: docker, with the same image as the Kubernetes manifests (ghcr.io/ferry-project/ferry,
# built by deploy/Dockerfile), so nothing but Docker is needed on the clients and the control
# plane runs unprivileged as uid 10001. (raw_exec would work too, with Ferry installed on the host
# by ./setup.sh and command = "/path/to/.venv/bin/python".)
#
# Settings: the template below writes /local/ferry.yaml (FERRY_CONFIG); nats_url comes from the
# Nomad service "nats" (nats.nomad.hcl), over TLS with the cluster's CA.
# Probes: Nomad's own service checks can only be http or tcp, so the API gets a tcp check; with
# Consul (provider = "consul") add script checks that run `python -m ferry.<svc> --check`.

locals {
  image = "ghcr.io/ferry-project/ferry:0.1.0"

  ferry_config = <<-EOT
  nats_url: "{{ range $i, $s := nomadService "nats" }}{{ if $i }},{{ end }}tls://{{ $s.Address }}:{{ $s.Port }}{{ end }}"
  nats_ca: /secrets/tls-ca.pem
  nats_replicas: 3
  heartbeat_interval_s: 1.0
  heartbeat_timeout_s: 5.0
  drain_timeout_s: 20
  otel_exporter: none
  log_level: INFO
  EOT
}

job "ferry" {
  type = "service"

  group "control" {
    count = 1

    network {
      port "grpc" {
        static = 7070
        to     = 7070
      }
    }

    service {
      name     = "ferry-api"
      provider = "nomad"
      port     = "grpc"
      task     = "api"

      check {
        type     = "tcp"
        interval = "10s"
        timeout  = "2s"
      }
    }

    restart {
      attempts = 10
      interval = "10m"
      delay    = "5s"
      mode     = "delay"
    }

    task "api" {
      driver       = "docker"
      user         = "10001"
      kill_signal  = "SIGTERM"
      kill_timeout = "30s" # longer than drain_timeout_s

      config {
        image   = local.image
        command = "python"
        args    = ["-m", "ferry.api"]
        ports   = ["grpc"]
      }

      env {
        FERRY_CONFIG              = "/local/ferry.yaml"
        FERRY_ADDR                = "0.0.0.0:7070"
        FERRY_NATS_CREDS          = "/secrets/nats-api.json"
        FERRY_TLS_CERT            = "/secrets/tls-server.pem"
        FERRY_TLS_KEY             = "/secrets/tls-server.key"
        FERRY_TOKENS_FILE         = "/secrets/tokens.yaml"
        FERRY_ENV_PUBLIC_KEY_FILE = "/secrets/env.pub"
      }

      template {
        destination = "secrets/nats-api.json"
        perms       = "0400"
        uid         = 10001
        gid         = 10001
        change_mode = "restart"
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/ferry/keys" }}{{ index . "nats-api.json" }}{{ end }}
        EOT
      }

      template {
        destination = "secrets/tls-ca.pem"
        perms       = "0400"
        uid         = 10001
        gid         = 10001
        change_mode = "restart"
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/ferry/keys" }}{{ index . "tls-ca.pem" }}{{ end }}
        EOT
      }

      template {
        destination = "secrets/tls-server.pem"
        perms       = "0400"
        uid         = 10001
        gid         = 10001
        change_mode = "restart"
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/ferry/keys" }}{{ index . "tls-server.pem" }}{{ end }}
        EOT
      }

      template {
        destination = "secrets/tls-server.key"
        perms       = "0400"
        uid         = 10001
        gid         = 10001
        change_mode = "restart"
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/ferry/keys" }}{{ index . "tls-server.key" }}{{ end }}
        EOT
      }

      template {
        destination = "secrets/tokens.yaml"
        perms       = "0400"
        uid         = 10001
        gid         = 10001
        change_mode = "restart"
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/ferry/keys" }}{{ index . "tokens.yaml" }}{{ end }}
        EOT
      }

      template {
        destination = "secrets/env.pub"
        perms       = "0400"
        uid         = 10001
        gid         = 10001
        change_mode = "restart"
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/ferry/keys" }}{{ index . "env.pub" }}{{ end }}
        EOT
      }


      template {
        destination = "local/ferry.yaml"
        data        = local.ferry_config
        change_mode = "restart"
      }

      resources {
        cpu    = 200
        memory = 256
      }
    }

    task "scheduler" {
      driver       = "docker"
      user         = "10001"
      kill_signal  = "SIGTERM"
      kill_timeout = "30s"

      config {
        image   = local.image
        command = "python"
        args    = ["-m", "ferry.scheduler"]
      }

      env {
        FERRY_CONFIG     = "/local/ferry.yaml"
        FERRY_NATS_CREDS = "/secrets/nats-scheduler.json"
      }

      template {
        destination = "secrets/nats-scheduler.json"
        perms       = "0400"
        uid         = 10001
        gid         = 10001
        change_mode = "restart"
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/ferry/keys" }}{{ index . "nats-scheduler.json" }}{{ end }}
        EOT
      }

      template {
        destination = "secrets/tls-ca.pem"
        perms       = "0400"
        uid         = 10001
        gid         = 10001
        change_mode = "restart"
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/ferry/keys" }}{{ index . "tls-ca.pem" }}{{ end }}
        EOT
      }


      template {
        destination = "local/ferry.yaml"
        data        = local.ferry_config
        change_mode = "restart"
      }

      resources {
        cpu    = 300
        memory = 512
      }
    }

    task "health" {
      driver       = "docker"
      user         = "10001"
      kill_signal  = "SIGTERM"
      kill_timeout = "30s"

      config {
        image   = local.image
        command = "python"
        args    = ["-m", "ferry.health"]
      }

      env {
        FERRY_CONFIG     = "/local/ferry.yaml"
        FERRY_NATS_CREDS = "/secrets/nats-health.json"
      }

      template {
        destination = "secrets/nats-health.json"
        perms       = "0400"
        uid         = 10001
        gid         = 10001
        change_mode = "restart"
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/ferry/keys" }}{{ index . "nats-health.json" }}{{ end }}
        EOT
      }

      template {
        destination = "secrets/tls-ca.pem"
        perms       = "0400"
        uid         = 10001
        gid         = 10001
        change_mode = "restart"
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/ferry/keys" }}{{ index . "tls-ca.pem" }}{{ end }}
        EOT
      }


      template {
        destination = "local/ferry.yaml"
        data        = local.ferry_config
        change_mode = "restart"
      }

      resources {
        cpu    = 100
        memory = 192
      }
    }

    task "pricing" {
      driver       = "docker"
      user         = "10001"
      kill_signal  = "SIGTERM"
      kill_timeout = "30s"

      config {
        image   = local.image
        command = "python"
        args    = ["-m", "ferry.pricing"]
      }

      env {
        FERRY_CONFIG     = "/local/ferry.yaml"
        FERRY_NATS_CREDS = "/secrets/nats-pricing.json"
      }

      template {
        destination = "secrets/nats-pricing.json"
        perms       = "0400"
        uid         = 10001
        gid         = 10001
        change_mode = "restart"
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/ferry/keys" }}{{ index . "nats-pricing.json" }}{{ end }}
        EOT
      }

      template {
        destination = "secrets/tls-ca.pem"
        perms       = "0400"
        uid         = 10001
        gid         = 10001
        change_mode = "restart"
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/ferry/keys" }}{{ index . "tls-ca.pem" }}{{ end }}
        EOT
      }


      template {
        destination = "local/ferry.yaml"
        data        = local.ferry_config
        change_mode = "restart"
      }

      resources {
        cpu    = 100
        memory = 192
      }
    }

    task "autoscaler" {
      driver       = "docker"
      user         = "10001"
      kill_signal  = "SIGTERM"
      kill_timeout = "30s"

      config {
        image   = local.image
        command = "python"
        args    = ["-m", "ferry.autoscaler"]
      }

      env {
        FERRY_CONFIG     = "/local/ferry.yaml"
        FERRY_NATS_CREDS = "/secrets/nats-autoscaler.json"
      }

      # provider, instance_types and the cloud's settings go in ferry.yaml (ferry.fleet.providers);
      # a cloud's credentials as the task's own secrets, e.g. AWS_* from nomad/jobs/ferry/cloud

      template {
        destination = "secrets/nats-autoscaler.json"
        perms       = "0400"
        uid         = 10001
        gid         = 10001
        change_mode = "restart"
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/ferry/keys" }}{{ index . "nats-autoscaler.json" }}{{ end }}
        EOT
      }

      template {
        destination = "secrets/tls-ca.pem"
        perms       = "0400"
        uid         = 10001
        gid         = 10001
        change_mode = "restart"
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/ferry/keys" }}{{ index . "tls-ca.pem" }}{{ end }}
        EOT
      }


      template {
        destination = "local/ferry.yaml"
        data        = local.ferry_config
        change_mode = "restart"
      }

      resources {
        cpu    = 100
        memory = 192
      }
    }
  }
}
