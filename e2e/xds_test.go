package e2e

import (
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/slidingwindow/ratelimit/internal/tlsconfig"
	"github.com/slidingwindow/ratelimit/internal/tlsconfig/tlsconfigtest"
	"github.com/slidingwindow/ratelimit/internal/xdsconfig/xdsconfigtest"
)

// xdsNode is the node id Envoy Gateway gives the rate limit service.
const xdsNode = "envoy-ratelimit"

// xdsFlags point the service at srv as Envoy Gateway does, with short
// backoffs so that a reconnect happens within the test.
func xdsFlags(srv *xdsconfigtest.Server, extra ...string) []string {
	return append([]string{"--config-type", "GRPC_XDS_SOTW", "--xds-server-url", srv.Addr, "--xds-node-id", xdsNode,
		"--xds-backoff-initial", "50ms", "--xds-backoff-max", "500ms"}, extra...)
}

// The rules are per hour, so that no window boundary falls within a test
// but once in a long while.

// admitted asks for value under key in domain until the first OVER_LIMIT,
// at most limit+1 times, and returns how many were admitted.
func admitted(t *testing.T, s *server, domain, key, value string, limit int) int {
	t.Helper()
	for i := 0; i <= limit; i++ {
		if s.ask(t, request(domain, descriptor(key, value))).OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
			return i
		}
	}
	return limit + 1
}

// TestXDSConfig serves the config over xDS as Envoy Gateway does, and
// walks through a control plane's life: a config, a change, a bad one
// refused while the previous one keeps limiting, a restart of the control
// plane with a change made while it was away.
func TestXDSConfig(t *testing.T) {
	t.Parallel()
	srv := xdsconfigtest.Start(t)
	srv.Set(t, xdsNode, "1", xdsconfigtest.Config("api", "api", "user", 3, rlsconfv3.RateLimitUnit_HOUR))
	// --config is set, as Envoy Gateway sets RUNTIME_ROOT: it is not read.
	s := startServer(t, startRedis(t), "this is not read", xdsFlags(srv)...)

	if got := admitted(t, s, "api", "user", "alice", 3); got != 3 {
		t.Fatalf("version 1: alice admitted %d times, want 3", got)
	}
	srv.WaitRequest(t, 10*time.Second, "ACK of version 1", func(r xdsconfigtest.Request) bool { return r.IsACK("1") })
	if v := rlconfig(t, s); len(v.Rules) != 1 || v.Rules[0].Source != "xds/api:3" {
		t.Errorf("/rlconfig rules %+v", v.Rules)
	}

	// A change applies.
	srv.Set(t, xdsNode, "2", xdsconfigtest.Config("api", "api", "user", 5, rlsconfv3.RateLimitUnit_HOUR))
	srv.WaitRequest(t, 10*time.Second, "ACK of version 2", func(r xdsconfigtest.Request) bool { return r.IsACK("2") })
	if got := admitted(t, s, "api", "user", "bob", 5); got != 5 {
		t.Errorf("version 2: bob admitted %d times, want 5", got)
	}

	// A bad config is refused: the server sees the NACK with the reason,
	// the service says so, and version 2 still limits.
	srv.Set(t, xdsNode, "3", xdsconfigtest.Config("api", "api", "user", 1, rlsconfv3.RateLimitUnit_UNKNOWN))
	nack := srv.WaitRequest(t, 10*time.Second, "NACK of version 3", func(r xdsconfigtest.Request) bool { return r.IsNACK("2") })
	if !strings.Contains(nack.ErrorDetail.GetMessage(), "xds/api:3: rate_limit unit is missing") {
		t.Errorf("NACK detail %q", nack.ErrorDetail.GetMessage())
	}
	if got := admitted(t, s, "api", "user", "carol", 5); got != 5 {
		t.Errorf("after the refused version 3: carol admitted %d times, want 5", got)
	}
	v := rlconfig(t, s)
	if v.LastReloadError == nil || !strings.Contains(v.LastReloadError.Error, `version "3"`) || v.Generation != 2 {
		t.Errorf("/rlconfig after the refused version: generation %d, last error %+v", v.Generation, v.LastReloadError)
	}
	if n := metricSum(t, s, "ratelimit_config_reloads_total", `outcome="failure"`); n < 1 {
		t.Errorf("ratelimit_config_reloads_total{outcome=\"failure\"} = %v", n)
	}

	// The control plane restarts; a change made while it was away arrives
	// over the stream the service opens again.
	srv.Stop()
	srv.Set(t, xdsNode, "4", xdsconfigtest.Config("api", "api", "user", 2, rlsconfv3.RateLimitUnit_HOUR))
	if got := admitted(t, s, "api", "user", "dan", 5); got != 5 {
		t.Errorf("control plane away: dan admitted %d times, want 5 (the config in force stays)", got)
	}
	srv.Restart(t)
	srv.WaitRequest(t, 20*time.Second, "ACK of version 4", func(r xdsconfigtest.Request) bool { return r.IsACK("4") })
	if got := admitted(t, s, "api", "user", "dave", 5); got != 2 {
		t.Errorf("version 4: dave admitted %d times, want 2", got)
	}
	s.waitLog(t, "xDS config stream ended")
}

// TestXDSConfigMutualTLSForceStart runs the service as Envoy Gateway does:
// mutual TLS to the control plane, and FORCE_START_WITHOUT_INITIAL_CONFIG,
// so it serves at once and fails rate limit calls until the first config
// arrives.
func TestXDSConfigMutualTLSForceStart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := tlsconfigtest.NewCA(t, "eg-ca")
	serverCert, serverKey := ca.Server(t, "envoy-gateway").Write(t, dir, "server")
	clientCert, clientKey := ca.Client(t, "envoy-ratelimit").Write(t, dir, "client")
	caFile := ca.WriteCA(t, dir, "ca")
	serverTLS, err := tlsconfig.NewServer(serverCert, serverKey, caFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := xdsconfigtest.Start(t, grpc.Creds(credentials.NewTLS(serverTLS)))

	s := startServer(t, startRedis(t), "", xdsFlags(srv, "--force-start-without-initial-config",
		"--xds-tls", "--xds-tls-cert", clientCert, "--xds-tls-key", clientKey, "--xds-tls-ca", caFile, "--xds-tls-san", "localhost")...)
	// Serving (startServer waited for SERVING), but with no config yet:
	// rate limit calls fail, for Envoy's failure_mode_deny to decide.
	_, err = s.rls.ShouldRateLimit(t.Context(), request("api", descriptor("user", "erin")))
	if status.Code(err) != codes.Unavailable {
		t.Errorf("before any config: error %v, want UNAVAILABLE", err)
	}
	// The subscription is open over mutual TLS, waiting for the node's
	// snapshot.
	srv.WaitRequest(t, 10*time.Second, "a subscription", func(r xdsconfigtest.Request) bool { return r.Node.GetId() == xdsNode })

	srv.Set(t, xdsNode, "1", xdsconfigtest.Config("api", "api", "user", 3, rlsconfv3.RateLimitUnit_HOUR))
	srv.WaitRequest(t, 10*time.Second, "ACK of version 1", func(r xdsconfigtest.Request) bool { return r.IsACK("1") })
	if got := admitted(t, s, "api", "user", "frank", 3); got != 3 {
		t.Errorf("version 1: frank admitted %d times, want 3", got)
	}
}
