package app

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/slidingwindow/ratelimit/internal/configsource"
	"github.com/slidingwindow/ratelimit/internal/service"
	"github.com/slidingwindow/ratelimit/internal/settings"
	"github.com/slidingwindow/ratelimit/internal/xdsconfig/xdsconfigtest"
)

func TestXDSSettingsRefused(t *testing.T) {
	xds := []string{"--config-type", "GRPC_XDS_SOTW"}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--config-type", "YAML"}, `--config-type: "YAML" is not FILE or GRPC_XDS_SOTW`},
		{append(xds, "--xds-tls-ca", "ca.pem"), "--xds-tls-* flags need --xds-tls"},
		{append(xds, "--xds-tls", "--xds-tls-cert", "c.pem"), "--xds-tls-cert and --xds-tls-key go together"},
		{append(xds, "--xds-tls", "--xds-tls-ca", "/nonexistent/ca.pem"), "--xds-tls-*"},
		{append(xds, "--xds-node-metadata", "zone"), `--xds-node-metadata: "zone" is not key=value`},
		{append(xds, "--xds-headers", "=x"), `--xds-headers: "=x" is not key:value`},
		{append(xds, "--xds-backoff-initial", "0s"), "--xds-backoff-initial (0s) must be positive"},
		{append(xds, "--xds-backoff-max", "1s"), "--xds-backoff-max (1s) at least as long"},
		{append(xds, "--xds-max-msg-size", "-1"), "--xds-max-msg-size"},
		{append(xds, "--xds-backoff-factor", "0"), "--xds-backoff-factor: 0 is not a positive number"},
		{append(xds, "--xds-backoff-factor", "NaN"), "--xds-backoff-factor: NaN is not a positive number"},
		{append(xds, "--xds-node-id", ""), "--xds-node-id is empty"},
		{append(xds, "--default-algorithm", "token_bucket"), "--default-algorithm"},
	}
	for _, tc := range cases {
		args := append([]string{"--log-level", "error"}, tc.args...)
		err := Main(context.Background(), args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Main %q: error %v, want one containing %q", tc.args, err, tc.want)
		}
	}
}

// rlconfig is the part of GET /rlconfig the tests read.
type rlconfig struct {
	Generation uint64   `json:"generation"`
	Files      []string `json:"files"`
	Rules      []struct {
		Domain          string `json:"domain"`
		RequestsPerUnit uint32 `json:"requests_per_unit"`
	} `json:"rules"`
}

func configOf(t *testing.T, svc *service.Service) rlconfig {
	t.Helper()
	rec := httptest.NewRecorder()
	svc.ConfigHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/rlconfig", nil))
	var c rlconfig
	if err := json.Unmarshal(rec.Body.Bytes(), &c); err != nil {
		t.Fatal(err)
	}
	return c
}

// startSource starts the xDS config source as New does.
func startSource(t *testing.T, addr string, extra ...string) configsource.Source {
	t.Helper()
	var s settings.Settings
	args := append([]string{"--config-type", "GRPC_XDS_SOTW", "--xds-server-url", addr, "--xds-node-id", "envoy-ratelimit",
		"--xds-backoff-initial", "20ms", "--xds-backoff-max", "100ms", "--config", "/data/ratelimit"}, extra...)
	if err := settings.Parse(settings.NewFlagSet("test", &s, &bytes.Buffer{}), &s, args); err != nil {
		t.Fatal(err)
	}
	x, err := openSource(context.Background(), &s, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Close() })
	return x
}

// TestXDSSourceWaitsForTheFirstConfig: without
// --force-start-without-initial-config, the service starts with the first
// config the server sends, then follows its changes. --config is ignored,
// as Envoy Gateway sets RUNTIME_ROOT beside CONFIG_TYPE.
func TestXDSSourceWaitsForTheFirstConfig(t *testing.T) {
	noLeaks(t)
	srv := xdsconfigtest.Start(t)
	x := startSource(t, srv.Addr)

	// Nothing served: first keeps waiting until its context ends.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if cfg, err := x.First(ctx); cfg != nil || err != nil {
		t.Fatalf("first with nothing served: %v, %v; want nil, nil when the context ends", cfg, err)
	}

	srv.Set(t, "envoy-ratelimit", "1", xdsconfigtest.Config("api", "api", "user", 5, rlsconfv3.RateLimitUnit_MINUTE))
	cfg, err := x.First(context.Background())
	if err != nil || cfg == nil || !cfg.HasDomain("api") {
		t.Fatalf("first: %v, %v", cfg, err)
	}
	svc := service.New(cfg, nil, nil)
	x.Follow(t.Context(), svc)

	srv.Set(t, "envoy-ratelimit", "2", xdsconfigtest.Config("api", "api", "user", 8, rlsconfv3.RateLimitUnit_MINUTE))
	waitConfig(t, srv, "2", svc, func(c rlconfig) bool { return c.Generation == 2 && c.Rules[0].RequestsPerUnit == 8 })
	if c := configOf(t, svc); len(c.Files) != 1 || c.Files[0] != "xds/api" {
		t.Errorf("files %q", c.Files)
	}
}

// TestXDSSourceForceStart: with --force-start-without-initial-config the
// service starts at once on an empty config, and takes the first one the
// server sends when it comes.
func TestXDSSourceForceStart(t *testing.T) {
	noLeaks(t)
	srv := xdsconfigtest.Start(t)
	x := startSource(t, srv.Addr, "--force-start-without-initial-config")
	cfg, err := x.First(context.Background())
	if err != nil || cfg == nil || len(cfg.Rules()) != 0 {
		t.Fatalf("first: %v, %v; want an empty config at once", cfg, err)
	}
	svc := service.New(cfg, nil, nil)
	x.Follow(t.Context(), svc)
	srv.Set(t, "envoy-ratelimit", "1", xdsconfigtest.Config("api", "api", "user", 5, rlsconfv3.RateLimitUnit_MINUTE))
	waitConfig(t, srv, "1", svc, func(c rlconfig) bool { return c.Generation == 2 && len(c.Rules) == 1 })
}

// noLeaks fails t if it leaves a goroutine behind once its cleanups ran.
func noLeaks(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) }) // the first cleanup runs last
}

// waitConfig waits for the service to acknowledge version to srv, by which
// time the config is in force (the client acknowledges a config once
// OnConfig has returned), then checks the config in force.
func waitConfig(t *testing.T, srv *xdsconfigtest.Server, version string, svc *service.Service, ok func(rlconfig) bool) {
	t.Helper()
	srv.WaitRequest(t, 20*time.Second, "ACK of version "+version, func(r xdsconfigtest.Request) bool { return r.IsACK(version) })
	if c := configOf(t, svc); !ok(c) {
		t.Fatalf("config in force once version %s is acknowledged: %+v", version, c)
	}
}
