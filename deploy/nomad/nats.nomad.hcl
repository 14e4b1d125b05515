# NATS with JetStream for Ferry: three servers in one JetStream cluster, one per client, each with
# its store on a host volume.
#
#   ferry keys secret ./keys --format nomad | nomad var put -in json nomad/jobs/nats/keys -
#   nomad job run deploy/nomad/nats.nomad.hcl
#
# (./keys: see ferry.nomad.hcl; its TLS hosts must name the servers' addresses.) Clients and routes
# speak TLS; Ferry's users and their permissions come from nats-auth.conf.
#
# Needs, on each of three clients, a host volume in the client configuration:
#   client { host_volume "nats-data" { path = "/var/lib/nats" read_only = false } }
# and the docker driver. It registers the Nomad services "nats" (clients) and "nats-cluster"
# (routes); the Ferry jobs look up "nats" and create every stream and KV bucket with three replicas
# (nats_replicas: 3), so losing one server loses no acknowledged write. Every server fsyncs before
# it acknowledges (sync_interval: always: NATS' default of every 2 minutes loses acknowledged
# writes on power loss; bench/nats_sync.py measured the cost), and JetStream may use at most 4 GiB
# of the volume.

job "nats" {
  type = "service"

  group "nats" {
    count = 3

    # One server per client, so a machine's loss costs one replica, not the quorum.
    constraint {
      operator = "distinct_hosts"
      value    = "true"
    }

    # At most one server replaced at a time: two of three keep JetStream's quorum.
    update {
      max_parallel     = 1
      min_healthy_time = "30s"
    }

    network {
      port "client" {
        static = 4222
        to     = 4222
      }
      port "cluster" {
        static = 6222
        to     = 6222
      }
      port "monitor" {
        to = 8222
      }
    }

    volume "data" {
      type      = "host"
      source    = "nats-data"
      read_only = false
    }

    service {
      name     = "nats"
      provider = "nomad"
      port     = "client"

      check {
        type     = "http"
        port     = "monitor"
        path     = "/healthz?js-enabled-only=true"
        interval = "10s"
        timeout  = "3s"
      }
    }

    service {
      name     = "nats-cluster"
      provider = "nomad"
      port     = "cluster"
    }

    task "nats" {
      driver = "docker"
      # nats-server enters lame-duck mode on SIGTERM and flushes JetStream to disk.
      kill_signal  = "SIGTERM"
      kill_timeout = "60s"

      config {
        image = "nats:2.12-alpine"
        ports = ["client", "cluster", "monitor"]
        # The image's entrypoint prepends nats-server to arguments that start with "-".
        args = ["-c", "/local/nats.conf"]
      }

      # Routes to every registered server (a server's route to itself is dropped by NATS); the
      # file is re-rendered as servers come and go, and NATS reloads it on SIGHUP.
      template {
        destination   = "local/nats.conf"
        change_mode   = "signal"
        change_signal = "SIGHUP"
        data          = <<-EOT
        server_name: nats-{{ env "NOMAD_ALLOC_INDEX" }}
        listen: 0.0.0.0:4222
        http_port: 8222
        lame_duck_duration: 30s
        include "../secrets/nats-auth.conf"
        tls {
          cert_file: "/secrets/tls-server.pem"
          key_file: "/secrets/tls-server.key"
          ca_file: "/secrets/tls-ca.pem"
        }
        jetstream {
          store_dir: /data
          sync_interval: always
          max_file_store: 4GB
          max_memory_store: 64MB
        }
        cluster {
          name: ferry
          listen: 0.0.0.0:6222
          routes: [
          {{- range nomadService "nats-cluster" }}
            nats-route://{{ .Address }}:{{ .Port }}
          {{- end }}
          ]
          connect_retries: 120
          tls {
            cert_file: "/secrets/tls-server.pem"
            key_file: "/secrets/tls-server.key"
            ca_file: "/secrets/tls-ca.pem"
          }
        }
        EOT
      }

      template {
        destination = "secrets/nats-auth.conf"
        perms       = "0400"
        change_mode = "signal"
        change_signal = "SIGHUP"
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/nats/keys" }}{{ index . "nats-auth.conf" }}{{ end }}
        EOT
      }

      template {
        destination = "secrets/tls-ca.pem"
        perms       = "0400"
        change_mode = "signal"
        change_signal = "SIGHUP"
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/nats/keys" }}{{ index . "tls-ca.pem" }}{{ end }}
        EOT
      }

      template {
        destination = "secrets/tls-server.pem"
        perms       = "0400"
        change_mode = "signal"
        change_signal = "SIGHUP"
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/nats/keys" }}{{ index . "tls-server.pem" }}{{ end }}
        EOT
      }

      template {
        destination = "secrets/tls-server.key"
        perms       = "0400"
        change_mode = "signal"
        change_signal = "SIGHUP"
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/nats/keys" }}{{ index . "tls-server.key" }}{{ end }}
        EOT
      }


      volume_mount {
        volume      = "data"
        destination = "/data"
      }

      resources {
        cpu    = 500
        memory = 1024
      }
    }
  }
}
