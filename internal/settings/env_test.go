package settings

import (
	"bufio"
	"bytes"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestEnvTableIsComplete: every variable envoyproxy/ratelimit reads has a
// row (in the table or in noEffect), and the table has no other.
func TestEnvTableIsComplete(t *testing.T) {
	f, err := os.Open(filepath.Join("testdata", "reference-env.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" && !strings.HasPrefix(line, "#") {
			want[line] = true
		}
	}
	seen := map[string]bool{}
	for _, v := range allVars() {
		if seen[v.Name] {
			t.Errorf("%s has two rows", v.Name)
		}
		seen[v.Name] = true
		if !want[v.Name] {
			t.Errorf("%s is not a variable of the reference", v.Name)
		}
		if v.flag == "" && !strings.HasPrefix(v.Here, "no effect") && v.Name != "BACKEND_TYPE" {
			t.Errorf("%s has no flag, and its row does not say it has no effect: %q", v.Name, v.Here)
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("%s, read by the reference, has no row", name)
		}
	}
}

// istioEnv is the environment of Istio's samples/ratelimit/rate-limit-service.yaml.
var istioEnv = map[string]string{
	"LOG_LEVEL": "debug", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379", "USE_STATSD": "false",
	"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_WATCH_ROOT": "false",
	"RUNTIME_IGNOREDOTFILES": "true", "HOST": "::", "GRPC_HOST": "::",
}

// envoyGatewayEnv is the environment Envoy Gateway's
// internal/infrastructure/kubernetes/ratelimit/resource.go gives, with a
// Redis over TLS with a client certificate and Prometheus on.
var envoyGatewayEnv = map[string]string{
	"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_IGNOREDOTFILES": "true",
	"RUNTIME_WATCH_ROOT": "false", "LOG_LEVEL": "info", "USE_STATSD": "false",
	"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": "envoy-gateway:18001", "CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit",
	"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/certs/tls.crt", "GRPC_SERVER_TLS_KEY": "/certs/tls.key",
	"GRPC_SERVER_TLS_CA_CERT":        "/certs/ca.crt", // not the reference's: ignored there too
	"CONFIG_GRPC_XDS_SERVER_USE_TLS": "true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "/certs/tls.crt",
	"CONFIG_GRPC_XDS_CLIENT_TLS_KEY": "/certs/tls.key", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "/certs/ca.crt",
	"FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
	"REDIS_SOCKET_TYPE":                  "tcp", "REDIS_URL": "redis.redis-system.svc.cluster.local:6379", "REDIS_TLS": "true",
	"REDIS_TLS_CLIENT_CERT": "/redis-certs/tls.crt", "REDIS_TLS_CLIENT_KEY": "/redis-certs/tls.key",
	"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": ":19001", "PROMETHEUS_MAPPER_YAML": "/etc/statsd-exporter/conf.yaml",
}

func TestPlanEnv(t *testing.T) {
	// Rules naming no algorithm count on the reference's keys whenever its
	// environment is in use.
	const ref = "reference_fixed_window"
	cases := []struct {
		name     string
		env      map[string]string
		explicit []string          // flags set on the command line or by RATELIMIT_*
		want     map[string]string // flag values asked for; nil: none
		err      string            // the error must contain it
		notes    []string          // variables some note must name
	}{
		{name: "nothing set", env: nil, want: map[string]string{}},
		{name: "Istio's sample", env: istioEnv, want: map[string]string{
			"redis-url": "redis://redis:6379", "http-addr": "[::]:8080", "grpc-addr": "[::]:8081",
			"debug-addr": "0.0.0.0:6070", "config": "/data/ratelimit/config", "default-algorithm": ref, "config-files": "visible", "log-level": "debug",
		}, notes: []string{"RUNTIME_WATCH_ROOT"}},
		{name: "Envoy Gateway's", env: envoyGatewayEnv, want: map[string]string{
			"redis-url": "rediss://redis.redis-system.svc.cluster.local:6379", "redis-tls-cert": "/redis-certs/tls.crt",
			"redis-tls-key": "/redis-certs/tls.key", "grpc-tls-cert": "/certs/tls.crt", "grpc-tls-key": "/certs/tls.key",
			"metrics-addr": ":19001", "metrics-path": "/metrics", "debug-addr": "0.0.0.0:6070", "default-algorithm": ref,
			"config": "/data/ratelimit/config", "config-files": "visible", "log-level": "info",
			"config-type": "GRPC_XDS_SOTW", "xds-server-url": "envoy-gateway:18001", "xds-node-id": "envoy-ratelimit",
			"xds-tls": "true", "xds-tls-cert": "/certs/tls.crt", "xds-tls-key": "/certs/tls.key", "xds-tls-ca": "/certs/ca.crt",
			"force-start-without-initial-config": "true",
		}, notes: []string{"PROMETHEUS_MAPPER_YAML"}},
		// The reference reads every file under its directory, dot files too
		// unless RUNTIME_IGNOREDOTFILES; a directory --config names is read
		// as --config-files says.
		{name: "the reference's directory reads every file", env: map[string]string{"RUNTIME_ROOT": "/srv", "RUNTIME_SUBDIRECTORY": "rl"},
			want: map[string]string{"config": "/srv/rl/config", "config-files": "all", "debug-addr": "0.0.0.0:6070",
				"default-algorithm": ref, "statsd-addr": "localhost:8125"}},
		{name: "RUNTIME_IGNOREDOTFILES=false alone", env: map[string]string{"RUNTIME_IGNOREDOTFILES": "false"},
			want: map[string]string{"config-files": "all", "debug-addr": "0.0.0.0:6070", "default-algorithm": ref, "statsd-addr": "localhost:8125"}},
		{name: "RUNTIME_IGNOREDOTFILES alone", env: map[string]string{"RUNTIME_IGNOREDOTFILES": "true"},
			want: map[string]string{"config-files": "visible", "debug-addr": "0.0.0.0:6070", "default-algorithm": ref, "statsd-addr": "localhost:8125"}},
		{name: "--config given", env: map[string]string{"RUNTIME_ROOT": "/srv", "RUNTIME_IGNOREDOTFILES": "true"}, explicit: []string{"config"},
			want: map[string]string{"debug-addr": "0.0.0.0:6070", "default-algorithm": ref, "statsd-addr": "localhost:8125"}},
		{name: "--config-files given", env: map[string]string{"RUNTIME_ROOT": "/srv", "RUNTIME_IGNOREDOTFILES": "true"},
			explicit: []string{"config-files"}, want: map[string]string{"config": "/srv/config", "debug-addr": "0.0.0.0:6070",
				"default-algorithm": ref, "statsd-addr": "localhost:8125"}},
		{name: "RUNTIME_IGNOREDOTFILES not a bool", env: map[string]string{"RUNTIME_IGNOREDOTFILES": "yes"},
			err: `RUNTIME_IGNOREDOTFILES: "yes" is not true or false`},
		{name: "ports", env: map[string]string{"PORT": "9000", "GRPC_PORT": "9001", "DEBUG_HOST": "127.0.0.1"},
			want: map[string]string{"http-addr": "0.0.0.0:9000", "grpc-addr": "0.0.0.0:9001", "debug-addr": "127.0.0.1:6070",
				"default-algorithm": ref, "statsd-addr": "localhost:8125"}},
		{name: "gRPC on a Unix socket", env: map[string]string{"GRPC_UDS": "/tmp/rl.sock", "GRPC_PORT": "9001"},
			want: map[string]string{"grpc-addr": "unix:/tmp/rl.sock", "debug-addr": "0.0.0.0:6070",
				"default-algorithm": ref, "statsd-addr": "localhost:8125"}},
		{name: "a port that is none", env: map[string]string{"PORT": "http"}, err: `PORT: "http" is not a port number`},
		{name: "a Unix socket, from the path", env: map[string]string{"REDIS_URL": "/var/run/redis.sock", "REDIS_AUTH": "s3cret"},
			want: map[string]string{"redis-url": "unix://:s3cret@/var/run/redis.sock", "debug-addr": "0.0.0.0:6070",
				"default-algorithm": ref, "statsd-addr": "localhost:8125"}},
		{name: "the reference's default socket type is unix", env: map[string]string{"REDIS_SOCKET_TYPE": "unix", "REDIS_URL": "/run/redis.sock"},
			want: map[string]string{"redis-url": "unix:///run/redis.sock", "debug-addr": "0.0.0.0:6070",
				"default-algorithm": ref, "statsd-addr": "localhost:8125"}},
		{name: "user and password, escaped", env: map[string]string{"REDIS_URL": "r:6379", "REDIS_AUTH": "app:p@ss/w:rd"},
			want: map[string]string{"redis-url": "redis://app:p%40ss%2Fw%3Ard@r:6379", "debug-addr": "0.0.0.0:6070",
				"default-algorithm": ref, "statsd-addr": "localhost:8125"}},
		{name: "a URL as REDIS_URL", env: map[string]string{"REDIS_URL": "redis://r:6379/2", "REDIS_AUTH": "pw", "REDIS_TLS": "true"},
			want: map[string]string{"redis-url": "rediss://:pw@r:6379/2", "debug-addr": "0.0.0.0:6070",
				"default-algorithm": ref, "statsd-addr": "localhost:8125"}},
		{name: "cluster", env: map[string]string{"REDIS_TYPE": "cluster", "REDIS_URL": "a:7000,b:7001, c:7002", "REDIS_AUTH": "pw"},
			want: map[string]string{"redis-cluster-url": "redis://:pw@a:7000?addr=b%3A7001&addr=c%3A7002", "debug-addr": "0.0.0.0:6070",
				"default-algorithm": ref, "statsd-addr": "localhost:8125"}},
		{name: "sentinel", env: map[string]string{"REDIS_TYPE": "SENTINEL", "REDIS_URL": "mymaster,s1:26379,s2:26379",
			"REDIS_AUTH": "u:pw", "REDIS_SENTINEL_AUTH": "spw"},
			want: map[string]string{"redis-sentinel-url": "redis://:spw@s1:26379?addr=s2%3A26379&master_name=mymaster&password=pw&username=u",
				"debug-addr": "0.0.0.0:6070", "default-algorithm": ref, "statsd-addr": "localhost:8125"}},
		{name: "sentinel without a master", env: map[string]string{"REDIS_TYPE": "sentinel", "REDIS_URL": "s1:26379"},
			err: "MASTER_NAME,host:port"},
		{name: "TLS files without REDIS_TLS", env: map[string]string{"REDIS_URL": "r:6379", "REDIS_TLS_CACERT": "/ca.pem"},
			want:  map[string]string{"redis-url": "redis://r:6379", "debug-addr": "0.0.0.0:6070", "default-algorithm": ref, "statsd-addr": "localhost:8125"},
			notes: []string{"REDIS_TLS_CACERT"}},
		{name: "TLS, skipping the host name", env: map[string]string{"REDIS_URL": "r:6379", "REDIS_TLS": "true",
			"REDIS_TLS_CACERT": "/ca.pem", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "true"},
			want: map[string]string{"redis-url": "rediss://r:6379", "redis-tls-ca": "/ca.pem",
				"redis-tls-skip-hostname-verification": "true", "debug-addr": "0.0.0.0:6070", "default-algorithm": ref, "statsd-addr": "localhost:8125"}},
		{name: "TLS to a Unix socket", env: map[string]string{"REDIS_URL": "/r.sock", "REDIS_TLS": "true"}, err: "Unix socket"},
		{name: "a Redis setting without REDIS_URL", env: map[string]string{"REDIS_AUTH": "pw"}, err: "REDIS_URL is not"},
		{name: "REDIS_URL empty", env: map[string]string{"REDIS_URL": ""}, err: "REDIS_URL is empty"},
		{name: "host without port", env: map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis", "REDIS_AUTH": "hunter22"},
			err: `"redis" is not host:port`},
		{name: "a port that is none, with a password", env: map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379x", "REDIS_AUTH": "hunter22"},
			err: "the port is not a number"},
		// A REDIS_URL that is not host:port is quoted without its password.
		{name: "a URL with a password in a cluster list", env: map[string]string{"REDIS_TYPE": "CLUSTER", "REDIS_URL": "redis://:hunter22@a:7000,b:7001"},
			err: `"redis://:xxxxx@a:7000" is not host:port`},
		{name: "a URL with a password in a sentinel list",
			env: map[string]string{"REDIS_TYPE": "SENTINEL", "REDIS_URL": "mymaster,redis://:hunter22@s1:26379"},
			err: `"redis://:xxxxx@s1:26379" is not host:port`},
		{name: "user:password@host:port", env: map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "app:hunter22@r:6379"},
			err: `"xxxxx@r:6379" is not host:port`},
		{name: "a user@host:port", env: map[string]string{"REDIS_URL": "hunter22@r:6379"},
			err: `"xxxxx@r:6379" is not host:port`},
		{name: "a malformed URL with a password", env: map[string]string{"REDIS_URL": "redis://u:hunter22@r:6379%zz"},
			err: "xxxxx"},
		{name: "unknown REDIS_TYPE", env: map[string]string{"REDIS_URL": "r:6379", "REDIS_TYPE": "ring"}, err: "SINGLE, CLUSTER or SENTINEL"},
		{name: "unknown socket type", env: map[string]string{"REDIS_URL": "r:6379", "REDIS_SOCKET_TYPE": "udp"}, err: "tcp or unix"},
		{name: "memcache", env: map[string]string{"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": "m:11211"}, err: "Redis is the only backend"},
		{name: "the command line's Redis wins, whole",
			env:      map[string]string{"REDIS_TYPE": "CLUSTER", "REDIS_URL": "a:1,b:2", "REDIS_TLS": "true", "REDIS_TLS_CACERT": "/ca"},
			explicit: []string{"redis-url"}, want: map[string]string{"debug-addr": "0.0.0.0:6070", "default-algorithm": ref, "statsd-addr": "localhost:8125"},
			notes: []string{"REDIS_TYPE", "REDIS_URL", "REDIS_TLS", "REDIS_TLS_CACERT"}},
		{name: "the command line's algorithm wins", env: map[string]string{"PORT": "9000"},
			explicit: []string{"default-algorithm"}, want: map[string]string{"http-addr": "0.0.0.0:9000", "debug-addr": "0.0.0.0:6070",
				"statsd-addr": "localhost:8125"}},
		{name: "the command line's address wins", env: map[string]string{"PORT": "9000", "NEAR_LIMIT_RATIO": "0.5"},
			explicit: []string{"http-addr"}, want: map[string]string{"near-limit-ratio": "0.5", "debug-addr": "0.0.0.0:6070",
				"default-algorithm": ref, "statsd-addr": "localhost:8125"}},
		{name: "gRPC TLS", env: map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/c", "GRPC_SERVER_TLS_KEY": "/k",
			"GRPC_CLIENT_TLS_CACERT": "/ca", "GRPC_CLIENT_TLS_SAN": "envoy"},
			want: map[string]string{"grpc-tls-cert": "/c", "grpc-tls-key": "/k", "grpc-tls-client-ca": "/ca",
				"grpc-tls-client-san": "envoy", "debug-addr": "0.0.0.0:6070", "default-algorithm": ref, "statsd-addr": "localhost:8125"}},
		{name: "gRPC TLS without a key", env: map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/c"},
			err: "GRPC_SERVER_TLS_KEY is not set"},
		{name: "gRPC TLS files, TLS off", env: map[string]string{"GRPC_SERVER_TLS_CERT": "/c"},
			want: map[string]string{"debug-addr": "0.0.0.0:6070",
				"default-algorithm": ref, "statsd-addr": "localhost:8125"}, notes: []string{"GRPC_SERVER_TLS_CERT"}},
		{name: "a bad boolean", env: map[string]string{"SHADOW_MODE": "yes please"}, err: "SHADOW_MODE"},
		{name: "one to one", env: map[string]string{"SHADOW_MODE": "1", "CACHE_KEY_PREFIX": "edge_", "NEAR_LIMIT_RATIO": "0.9",
			"GRPC_MAX_CONNECTION_AGE": "1m", "LOG_FORMAT": "json", "LIMIT_RESPONSE_HEADERS_ENABLED": "true"},
			want: map[string]string{"shadow-mode": "true", "key-prefix": "edge_", "near-limit-ratio": "0.9",
				"grpc-max-connection-age": "1m0s", "log-format": "json", "ratelimit-headers": "true", "debug-addr": "0.0.0.0:6070",
				"default-algorithm": ref, "statsd-addr": "localhost:8125"}},
		{name: "text logs, logrus levels", env: map[string]string{"LOG_FORMAT": "text", "LOG_LEVEL": "WARNING"},
			want: map[string]string{"log-format": "console", "log-level": "warn", "debug-addr": "0.0.0.0:6070",
				"default-algorithm": ref, "statsd-addr": "localhost:8125"}},
		{name: "no local cache", env: map[string]string{"LOCAL_CACHE_SIZE_IN_BYTES": "0"},
			want: map[string]string{"deny-cache": "0s", "debug-addr": "0.0.0.0:6070", "default-algorithm": ref, "statsd-addr": "localhost:8125"}},
		{name: "a local cache", env: map[string]string{"LOCAL_CACHE_SIZE_IN_BYTES": "1048576"},
			want: map[string]string{"debug-addr": "0.0.0.0:6070", "default-algorithm": ref, "statsd-addr": "localhost:8125"}},
		// Stats: statsd unless USE_STATSD=false, as in the reference.
		{name: "statsd where the reference sends it", env: map[string]string{"STATSD_HOST": "statsd.local", "STATSD_PORT": "9125",
			"STATSD_PROTOCOL": "udp", "STATS_FLUSH_INTERVAL": "1500ms", "EXTRA_TAGS": "env:prod,zone:a"},
			want: map[string]string{"statsd-addr": "statsd.local:9125", "statsd-protocol": "udp", "statsd-flush-interval": "1.5s",
				"statsd-tags": "env:prod,zone:a", "debug-addr": "0.0.0.0:6070", "default-algorithm": ref}},
		{name: "statsd off", env: map[string]string{"USE_STATSD": "false", "STATSD_HOST": "statsd.local"},
			want: map[string]string{"debug-addr": "0.0.0.0:6070", "default-algorithm": ref}},
		{name: "stats disabled", env: map[string]string{"DISABLE_STATS": "true"}, want: map[string]string{"debug-addr": "0.0.0.0:6070",
			"default-algorithm": ref}},
		{name: "Prometheus, USE_STATSD unset", env: map[string]string{"USE_PROMETHEUS": "true"},
			want:  map[string]string{"metrics-addr": ":9090", "metrics-path": "/metrics", "debug-addr": "0.0.0.0:6070", "default-algorithm": ref},
			notes: []string{"USE_STATSD"}},
		{name: "DogStatsD, USE_STATSD unset", env: map[string]string{"USE_DOG_STATSD": "true"},
			want: map[string]string{"debug-addr": "0.0.0.0:6070", "default-algorithm": ref}, notes: []string{"USE_STATSD", "USE_DOG_STATSD"}},
		{name: "Prometheus and statsd", env: map[string]string{"USE_PROMETHEUS": "true", "USE_STATSD": "true"},
			want: map[string]string{"metrics-addr": ":9090", "metrics-path": "/metrics", "debug-addr": "0.0.0.0:6070", "default-algorithm": ref,
				"statsd-addr": "localhost:8125"}},
		{name: "the command line's statsd wins", env: map[string]string{"STATSD_HOST": "statsd.local"}, explicit: []string{"statsd-addr"},
			want: map[string]string{"debug-addr": "0.0.0.0:6070", "default-algorithm": ref}},
		{name: "a bad statsd port", env: map[string]string{"STATSD_PORT": "eighty"}, err: "STATSD_PORT"},
		{name: "a bad USE_STATSD", env: map[string]string{"USE_STATSD": "sometimes"}, err: "USE_STATSD"},
		// REDIS_PERSECOND_* are read as REDIS_* are, into --redis-persecond-*.
		{name: "per-second Redis, host:port", env: map[string]string{"REDIS_URL": "r:1", "REDIS_PERSECOND": "true",
			"REDIS_PERSECOND_SOCKET_TYPE": "tcp", "REDIS_PERSECOND_URL": "p:1", "REDIS_PERSECOND_AUTH": "u:pw",
			"REDIS_PERSECOND_POOL_SIZE": "20"},
			want: map[string]string{"redis-url": "redis://r:1", "redis-persecond-url": "redis://u:pw@p:1", "debug-addr": "0.0.0.0:6070",
				"default-algorithm": ref, "statsd-addr": "localhost:8125"},
			notes: []string{"REDIS_PERSECOND_POOL_SIZE"}},
		{name: "per-second Redis on a Unix socket", env: map[string]string{"REDIS_URL": "r:1", "REDIS_PERSECOND": "true",
			"REDIS_PERSECOND_URL": "/run/persecond.sock"},
			want: map[string]string{"redis-url": "redis://r:1", "redis-persecond-url": "unix:///run/persecond.sock", "debug-addr": "0.0.0.0:6070",
				"default-algorithm": ref, "statsd-addr": "localhost:8125"}},
		{name: "per-second Redis Cluster", env: map[string]string{"REDIS_URL": "r:1", "REDIS_PERSECOND": "true",
			"REDIS_PERSECOND_TYPE": "CLUSTER", "REDIS_PERSECOND_URL": "a:7000,b:7001", "REDIS_PERSECOND_AUTH": "pw"},
			want: map[string]string{"redis-url": "redis://r:1", "redis-persecond-cluster-url": "redis://:pw@a:7000?addr=b%3A7001",
				"debug-addr":        "0.0.0.0:6070",
				"default-algorithm": ref, "statsd-addr": "localhost:8125"}},
		{name: "per-second Redis Sentinel", env: map[string]string{"REDIS_URL": "r:1", "REDIS_PERSECOND": "true",
			"REDIS_PERSECOND_TYPE": "sentinel", "REDIS_PERSECOND_URL": "m2,s1:26379,s2:26379", "REDIS_PERSECOND_AUTH": "pw",
			"REDIS_PERSECOND_SENTINEL_AUTH": "spw", "REDIS_SENTINEL_AUTH": "other"},
			want: map[string]string{"redis-url": "redis://r:1",
				"redis-persecond-sentinel-url": "redis://:spw@s1:26379?addr=s2%3A26379&master_name=m2&password=pw", "debug-addr": "0.0.0.0:6070",
				"default-algorithm": ref, "statsd-addr": "localhost:8125"},
			notes: []string{"REDIS_SENTINEL_AUTH"}},
		// The reference builds one TLS config from REDIS_TLS_* when either
		// Redis has TLS on, and uses it for those that have.
		{name: "per-second Redis over TLS, the main one not", env: map[string]string{"REDIS_URL": "r:1", "REDIS_PERSECOND": "true",
			"REDIS_PERSECOND_URL": "p:1", "REDIS_PERSECOND_SOCKET_TYPE": "tcp", "REDIS_PERSECOND_TLS": "true", "REDIS_TLS_CACERT": "/ca.pem"},
			want: map[string]string{"redis-url": "redis://r:1", "redis-persecond-url": "rediss://p:1", "redis-tls-ca": "/ca.pem",
				"debug-addr":        "0.0.0.0:6070",
				"default-algorithm": ref, "statsd-addr": "localhost:8125"}},
		{name: "per-second variables without REDIS_PERSECOND", env: map[string]string{"REDIS_URL": "r:1",
			"REDIS_PERSECOND_URL": "p:1", "REDIS_PERSECOND_TLS": "true"},
			want: map[string]string{"redis-url": "redis://r:1", "debug-addr": "0.0.0.0:6070",
				"default-algorithm": ref, "statsd-addr": "localhost:8125"}, notes: []string{"REDIS_PERSECOND_URL", "REDIS_PERSECOND_TLS"}},
		{name: "REDIS_PERSECOND without its URL", env: map[string]string{"REDIS_URL": "r:1", "REDIS_PERSECOND": "true"},
			err: "REDIS_PERSECOND_URL is not set"},
		{name: "REDIS_PERSECOND without REDIS_URL", env: map[string]string{"REDIS_PERSECOND": "true", "REDIS_PERSECOND_URL": "p:1"},
			err: "REDIS_URL is not"},
		{name: "per-second sentinel without a master", env: map[string]string{"REDIS_URL": "r:1", "REDIS_PERSECOND": "true",
			"REDIS_PERSECOND_TYPE": "SENTINEL", "REDIS_PERSECOND_URL": "s1:26379"}, err: "REDIS_PERSECOND_URL: with REDIS_PERSECOND_TYPE=SENTINEL"},
		{name: "per-second TLS to a Unix socket", env: map[string]string{"REDIS_URL": "r:1", "REDIS_PERSECOND": "true",
			"REDIS_PERSECOND_URL": "/p.sock", "REDIS_PERSECOND_TLS": "true"}, err: "REDIS_PERSECOND_URL: TLS is on"},
		{name: "per-second password not shown", env: map[string]string{"REDIS_URL": "r:1", "REDIS_PERSECOND": "true",
			"REDIS_PERSECOND_SOCKET_TYPE": "tcp", "REDIS_PERSECOND_URL": "app:hunter22@p:1"}, err: `REDIS_PERSECOND_URL: "xxxxx@p:1" is not host:port`},
		{name: "unknown REDIS_PERSECOND_TYPE", env: map[string]string{"REDIS_URL": "r:1", "REDIS_PERSECOND": "true",
			"REDIS_PERSECOND_URL": "p:1", "REDIS_PERSECOND_TYPE": "ring"}, err: "REDIS_PERSECOND_TYPE=\"ring\""},
		{name: "the command line's per-second Redis wins, whole", env: map[string]string{"REDIS_URL": "r:1", "REDIS_PERSECOND": "true",
			"REDIS_PERSECOND_URL": "p:1", "REDIS_PERSECOND_TYPE": "CLUSTER"},
			explicit: []string{"redis-persecond-url"}, want: map[string]string{"redis-url": "redis://r:1", "debug-addr": "0.0.0.0:6070",
				"default-algorithm": ref, "statsd-addr": "localhost:8125"},
			notes: []string{"REDIS_PERSECOND_URL", "REDIS_PERSECOND_TYPE"}},
	}
	var s Settings
	fs := NewFlagSet("test", &s, &bytes.Buffer{})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lookup := func(name string) (string, bool) { v, ok := tc.env[name]; return v, ok }
			p, err := planEnv(lookup, func(f string) bool { return slices.Contains(tc.explicit, f) })
			for _, v := range tc.env {
				// No message repeats a password of the cases.
				if err != nil && strings.Contains(v, "hunter22") && strings.Contains(err.Error(), "hunter22") {
					t.Fatalf("error shows the password: %v", err)
				}
			}
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, v := range p.Values {
				if _, dup := got[v.Flag]; dup {
					t.Errorf("--%s set twice", v.Flag)
				}
				got[v.Flag] = v.Value
				if fs.Lookup(v.Flag) == nil {
					t.Errorf("--%s is no flag of this build", v.Flag)
				}
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("flags\n got %v\nwant %v", got, tc.want)
			}
			var noted []string
			for _, n := range p.Notes {
				noted = append(noted, n.Vars...)
			}
			for _, name := range tc.notes {
				if !slices.Contains(noted, name) {
					t.Errorf("no note names %s; notes: %+v", name, p.Notes)
				}
			}
		})
	}
}

// TestParseOrder: the command line wins over RATELIMIT_*, which wins over
// the reference's variables, which win over the defaults; and Istio's
// environment alone makes a complete setting.
func TestParseOrder(t *testing.T) {
	for k, v := range istioEnv {
		t.Setenv(k, v)
	}
	t.Setenv("RATELIMIT_LOG_LEVEL", "error")
	t.Setenv("NEAR_LIMIT_RATIO", "0.5")
	var s Settings
	fs := NewFlagSet("test", &s, &bytes.Buffer{})
	if err := Parse(fs, &s, []string{"--http-addr", ":7777"}); err != nil {
		t.Fatal(err)
	}
	if s.HTTPAddr != ":7777" || s.LogLevel != "error" || s.GRPCAddr != "[::]:8081" || s.NearLimitRatio != 0.5 ||
		s.RedisURL != "redis://redis:6379" || s.ConfigPath != "/data/ratelimit/config" || s.DebugAddr != "0.0.0.0:6070" {
		t.Fatalf("settings %+v", s)
	}
	if !s.RedisSettingGiven() {
		t.Fatal("REDIS_* set, but no Redis setting seen")
	}
	if s.StoreTimeout <= 0 || s.DrainTimeout != 10*time.Second {
		t.Fatalf("defaults lost: %+v", s)
	}
}

// TestOutOfRangeFlagsAreRefused: a value out of range is an error naming the
// flag, not silently replaced.
func TestOutOfRangeFlagsAreRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--store-timeout=0"}, "--store-timeout=0s"},
		{[]string{"--store-timeout=-1s"}, "--store-timeout"},
		{[]string{"--max-inflight=0"}, "--max-inflight=0"},
		{[]string{"--near-limit-ratio=5"}, "--near-limit-ratio=5"},
		{[]string{"--near-limit-ratio=0"}, "--near-limit-ratio=0"},
		{[]string{"--max-descriptors=0"}, "--max-descriptors"},
		{[]string{"--max-entries=-3"}, "--max-entries"},
		{[]string{"--max-request-bytes=0"}, "--max-request-bytes"},
		{[]string{"--deny-cache=-1s"}, "--deny-cache"},
		{[]string{"--drain-timeout=0"}, "--drain-timeout"},
		{[]string{"--shutdown-delay=-1s"}, "--shutdown-delay"},
		{[]string{"--grpc-max-connection-age=-1s"}, "--grpc-max-connection-age"},
		{[]string{"--key-prefix={tenant}"}, "--key-prefix"},
		{[]string{"--metrics-path=metrics"}, "--metrics-path"},
	} {
		var s Settings
		err := Parse(NewFlagSet("test", &s, &bytes.Buffer{}), &s, tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one containing %q", tc.args, err, tc.want)
		}
	}
	t.Setenv("NEAR_LIMIT_RATIO", "1.5")
	var s Settings
	if err := Parse(NewFlagSet("test", &s, &bytes.Buffer{}), &s, nil); err == nil || !strings.Contains(err.Error(), "near-limit-ratio") {
		t.Errorf("NEAR_LIMIT_RATIO=1.5: error %v", err)
	}
}

// TestRedisURLFlagHidesCredentials: --redis-url without a scheme is read as
// the reference's REDIS_URL (Validate's singleURL); one that is not host:port is
// quoted without what precedes its '@'.
func TestRedisURLFlagHidesCredentials(t *testing.T) {
	for _, raw := range []string{"app:hunter22@r:6379", "hunter22@r", ":hunter22@r:x"} {
		_, err := singleURL(raw, "", "", false)
		if err == nil || strings.Contains(err.Error(), "hunter22") || !strings.Contains(err.Error(), "xxxxx@r") {
			t.Errorf("--redis-url %s: error %v, want one quoting xxxxx@r", strings.ReplaceAll(raw, "hunter22", "…"), err)
		}
	}
}

// refRow is one of the reference's variables with the flag it sets ("" for
// none).
type refRow struct {
	RefVar
	flag string
}

// allVars are the reference's variables: the table's, then noEffect.
func allVars() []refRow {
	var all []refRow
	for _, e := range Table() {
		for _, v := range e.Ref {
			all = append(all, refRow{v, e.Name})
		}
	}
	for _, v := range noEffect {
		all = append(all, refRow{v, ""})
	}
	return all
}
