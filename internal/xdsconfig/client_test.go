package xdsconfig

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/tlsconfig"
	"github.com/slidingwindow/ratelimit/internal/tlsconfig/tlsconfigtest"
	"github.com/slidingwindow/ratelimit/internal/waitfor"
	"github.com/slidingwindow/ratelimit/internal/xdsconfig/xdsconfigtest"
)

const node = "envoy-ratelimit"

// wait bounds every wait for an event: generous, as the machine may be busy.
const wait = 20 * time.Second

// received collects what a client hands over.
type received struct {
	mu      sync.Mutex
	configs []*config.Config
	rejects []error
	changed chan struct{} // closed, and replaced, when a config comes
}

func newReceived() *received {
	return &received{changed: make(chan struct{})}
}

func (r *received) onConfig(c *config.Config) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.configs = append(r.configs, c)
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *received) onReject(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rejects = append(r.rejects, err)
}

func (r *received) counts() (configs, rejects int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.configs), len(r.rejects)
}

func (r *received) last() *config.Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.configs[len(r.configs)-1]
}

// waitConfigs waits until n configs were handed over and returns the last.
func (r *received) waitConfigs(t *testing.T, n int) *config.Config {
	t.Helper()
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		got, changed := len(r.configs), r.changed
		r.mu.Unlock()
		if got >= n {
			return r.last()
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("fewer than %d configs within %v", n, wait)
		}
	}
}

// runClient runs a client against addr until the test ends. An
// opts.OnConfig runs before the config is recorded.
func runClient(t *testing.T, addr string, creds credentials.TransportCredentials, opts Options) *received {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	r := newReceived()
	if opts.Node == nil {
		opts.Node = &corev3.Node{Id: node}
	}
	own := opts.OnConfig
	opts.OnConfig, opts.OnReject = func(c *config.Config) {
		if own != nil {
			own(c)
		}
		r.onConfig(c)
	}, r.onReject
	if opts.BackoffInitial == 0 {
		opts.BackoffInitial, opts.BackoffMax = 20*time.Millisecond, 200*time.Millisecond
	}
	c := New(conn, opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		if err := conn.Close(); err != nil {
			t.Error(err)
		}
	})
	return r
}

// limitOf returns the requests per unit of the rule on key in domain.
func limitOf(t *testing.T, c *config.Config, domain, key string) uint32 {
	t.Helper()
	for _, r := range c.Rules() {
		if r.Domain == domain && r.Levels[0].Key == key {
			return r.RequestsPerUnit
		}
	}
	t.Fatalf("no rule %s: %s in %v", domain, key, c.Files())
	return 0
}

// TestClientLifecycle walks through what a control plane does: serve a
// config, change it, send a bad one, fix it, go away and come back.
func TestClientLifecycle(t *testing.T) {
	srv := xdsconfigtest.Start(t)
	meta, err := structpb.NewStruct(map[string]any{"cluster": "eg"})
	if err != nil {
		t.Fatal(err)
	}
	srv.Set(t, node, "1", xdsconfigtest.Config("api", "api", "user", 5, rlsconfv3.RateLimitUnit_MINUTE))
	// How many requests the server had received when each config was
	// handed over: its ACK must come later in the server's record.
	var mu sync.Mutex
	var seenAtHandover []int
	got := runClient(t, srv.Addr, insecure.NewCredentials(), Options{
		Node: &corev3.Node{Id: node, Metadata: meta}, Defaults: config.Defaults{Algorithm: config.FixedWindow},
		OnConfig: func(*config.Config) {
			mu.Lock()
			defer mu.Unlock()
			seenAtHandover = append(seenAtHandover, len(srv.Requests()))
		},
	})
	// acked waits for the ACK of version and checks that it followed the
	// handover of the n-th config.
	acked := func(n int, version string) xdsconfigtest.Request {
		t.Helper()
		ack := srv.WaitRequest(t, wait, "ACK of version "+version, func(r xdsconfigtest.Request) bool { return r.IsACK(version) })
		i := slices.IndexFunc(srv.Requests(), func(r xdsconfigtest.Request) bool { return r.IsACK(version) })
		mu.Lock()
		defer mu.Unlock()
		if len(seenAtHandover) < n {
			t.Fatalf("version %s acknowledged, but only %d configs handed over, want %d", version, len(seenAtHandover), n)
		}
		if seen := seenAtHandover[n-1]; i < seen {
			t.Errorf("version %s: ACK is the server's request %d, but it had %d requests when config %d was handed over: acknowledged first",
				version, i+1, seen, n)
		}
		return ack
	}

	// Served: handed over, then acknowledged, with the node it asked as.
	c := got.waitConfigs(t, 1)
	if limitOf(t, c, "api", "user") != 5 || c.Rules()[0].Algorithm != config.FixedWindow {
		t.Errorf("first config: %+v", c.Rules()[0])
	}
	ack := acked(1, "1")
	first := srv.Requests()[0]
	if first.TypeUrl != TypeURL || first.VersionInfo != "" || first.ResponseNonce != "" || len(first.ResourceNames) != 0 {
		t.Errorf("subscription %v: want a wildcard subscription to %s with no version", first.DiscoveryRequest, TypeURL)
	}
	if first.Node.GetId() != node || first.Node.GetMetadata().GetFields()["cluster"].GetStringValue() != "eg" {
		t.Errorf("node %v", first.Node)
	}

	// Changed.
	srv.Set(t, node, "2", xdsconfigtest.Config("api", "api", "user", 9, rlsconfv3.RateLimitUnit_MINUTE))
	if c := got.waitConfigs(t, 2); limitOf(t, c, "api", "user") != 9 {
		t.Errorf("second config: limit %d, want 9", limitOf(t, c, "api", "user"))
	}
	acked(2, "2")

	// Bad: refused with the reason, version 2 stays in force, and nothing
	// is handed over.
	bad := xdsconfigtest.Config("api", "api", "user", 9, rlsconfv3.RateLimitUnit_UNKNOWN)
	srv.Set(t, node, "3", bad)
	nack := srv.WaitRequest(t, wait, "NACK of version 3", func(r xdsconfigtest.Request) bool { return r.IsNACK("2") })
	if msg := nack.ErrorDetail.GetMessage(); !strings.Contains(msg, `version "3"`) || !strings.Contains(msg, "xds/api:3: rate_limit unit is missing") {
		t.Errorf("NACK detail %q", msg)
	}
	if n, rejects := got.counts(); n != 2 || rejects == 0 {
		t.Errorf("after the bad config: %d configs, %d rejects; want 2 and some", n, rejects)
	}
	// The server sends the refused version again at once after each NACK;
	// the client's repeated NACKs wait BackoffInitial (20 ms here), so a
	// second holds at most a few dozen, not the thousands of a loop.
	time.Sleep(time.Second) // the rate over a second of real time is what is tested
	nacks := 0
	for _, r := range srv.Requests() {
		if r.IsNACK("2") {
			nacks++
		}
	}
	t.Logf("NACKs in a second: %d", nacks)
	if nacks > 100 {
		t.Errorf("%d NACKs in a second: client and server loop", nacks)
	}

	// Fixed.
	srv.Set(t, node, "4", xdsconfigtest.Config("api", "api", "user", 4, rlsconfv3.RateLimitUnit_SECOND))
	if c := got.waitConfigs(t, 3); limitOf(t, c, "api", "user") != 4 {
		t.Errorf("fixed config: limit %d, want 4", limitOf(t, c, "api", "user"))
	}
	acked(3, "4")

	// The control plane goes away and comes back: a new stream names the
	// version in force, and a change made meanwhile arrives.
	srv.Stop()
	srv.Set(t, node, "5", xdsconfigtest.Config("api", "api", "user", 6, rlsconfv3.RateLimitUnit_SECOND))
	srv.Restart(t)
	srv.WaitRequest(t, wait, "a new stream", func(r xdsconfigtest.Request) bool {
		return r.Stream != ack.Stream && r.ResponseNonce == "" && r.VersionInfo == "4"
	})
	if c := got.waitConfigs(t, 4); limitOf(t, c, "api", "user") != 6 {
		t.Errorf("config after the restart: limit %d, want 6", limitOf(t, c, "api", "user"))
	}
	acked(4, "5")

	// An empty state of the world is a config that limits nothing.
	srv.Set(t, node, "6")
	if c := got.waitConfigs(t, 5); len(c.Rules()) != 0 || c.HasDomain("api") {
		t.Errorf("empty snapshot: %d rules", len(c.Rules()))
	}
	acked(5, "6")
}

// TestClientOtherNode: the server picks the config by node id; another
// node's config never arrives.
func TestClientOtherNode(t *testing.T) {
	srv := xdsconfigtest.Start(t)
	srv.Set(t, "someone-else", "1", xdsconfigtest.Config("api", "api", "user", 5, rlsconfv3.RateLimitUnit_MINUTE))
	srv.Set(t, node, "7", xdsconfigtest.Config("mine", "mine", "k", 1, rlsconfv3.RateLimitUnit_SECOND))
	got := runClient(t, srv.Addr, insecure.NewCredentials(), Options{})
	c := got.waitConfigs(t, 1)
	if !c.HasDomain("mine") || c.HasDomain("api") {
		t.Errorf("config of files %v", c.Files())
	}
}

// TestClientHeaders: the headers go with the stream, as
// CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS does.
func TestClientHeaders(t *testing.T) {
	var mu sync.Mutex
	var seen metadata.MD
	srv := xdsconfigtest.Start(t, grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		md, _ := metadata.FromIncomingContext(ss.Context())
		mu.Lock()
		seen = md
		mu.Unlock()
		return h(srv, ss)
	}))
	srv.Set(t, node, "1", xdsconfigtest.Config("api", "api", "user", 5, rlsconfv3.RateLimitUnit_MINUTE))
	got := runClient(t, srv.Addr, insecure.NewCredentials(), Options{Headers: metadata.Pairs("authorization", "Bearer t0k")})
	got.waitConfigs(t, 1)
	mu.Lock()
	defer mu.Unlock()
	if v := seen.Get("authorization"); len(v) != 1 || v[0] != "Bearer t0k" {
		t.Errorf("authorization header %q", v)
	}
}

// TestClientMutualTLS: Envoy Gateway's setup. The server asks for a client
// certificate from its CA; the client checks the server's against the CA
// and the name it must hold.
func TestClientMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlsconfigtest.NewCA(t, "xds-ca")
	serverCert, serverKey := ca.Server(t, "envoy-gateway").Write(t, dir, "server")
	clientCert, clientKey := ca.Client(t, "envoy-ratelimit").Write(t, dir, "client")
	caFile := ca.WriteCA(t, dir, "ca")
	serverTLS, err := tlsconfig.NewServer(serverCert, serverKey, caFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := xdsconfigtest.Start(t, grpc.Creds(credentials.NewTLS(serverTLS)))
	srv.Set(t, node, "1", xdsconfigtest.Config("api", "api", "user", 5, rlsconfv3.RateLimitUnit_MINUTE))

	t.Run("ok", func(t *testing.T) {
		clientTLS, err := tlsconfig.NewClient(caFile, clientCert, clientKey, "localhost", nil)
		if err != nil {
			t.Fatal(err)
		}
		got := runClient(t, srv.Addr, credentials.NewTLS(clientTLS), Options{})
		if c := got.waitConfigs(t, 1); limitOf(t, c, "api", "user") != 5 {
			t.Errorf("limit %d, want 5", limitOf(t, c, "api", "user"))
		}
		srv.WaitRequest(t, wait, "ACK of version 1", func(r xdsconfigtest.Request) bool { return r.IsACK("1") })
	})

	// Each failure is a handshake error the client logs as it backs off.
	for _, tt := range []struct {
		name             string
		san, cert, key   string
		wantLog, without string
	}{
		{"server name not in the certificate", "ratelimit.example", clientCert, clientKey, "ratelimit.example", ""},
		{"no client certificate", "localhost", "", "", "certificate required", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clientTLS, err := tlsconfig.NewClient(caFile, tt.cert, tt.key, tt.san, nil)
			if err != nil {
				t.Fatal(err)
			}
			core, logs := observer.New(zap.WarnLevel)
			got := runClient(t, srv.Addr, credentials.NewTLS(clientTLS), Options{Logger: zap.New(core)})
			found := waitfor.True(wait, 10*time.Millisecond, func() bool {
				for _, e := range logs.FilterMessageSnippet("stream ended").All() {
					if err, ok := e.ContextMap()["error"].(string); ok && strings.Contains(err, tt.wantLog) {
						return true
					}
				}
				return false
			})
			if !found {
				t.Fatalf("no stream failure mentioning %q within %v; logs: %v", tt.wantLog, wait, logs.All())
			}
			if n, _ := got.counts(); n != 0 {
				t.Errorf("%d configs through a failed handshake", n)
			}
		})
	}
}

func TestBackoff(t *testing.T) {
	c := New(nil, Options{BackoffInitial: time.Second, BackoffMax: 5 * time.Second})
	var got []time.Duration
	for a := range 6 {
		got = append(got, c.backoff(a))
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second, 5 * time.Second}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("backoffs %v, want %v", got, want)
		}
	}
	if d := c.backoff(1000); d != 5*time.Second {
		t.Errorf("attempt 1000: %v", d)
	}
	j := New(nil, Options{BackoffInitial: time.Second, BackoffMax: 5 * time.Second, Jitter: true})
	for a := range 100 {
		want := min(time.Second<<min(a, 10), 5*time.Second)
		if d := j.backoff(a); d < want/2 || d > want {
			t.Fatalf("attempt %d with jitter: %v, want within [%v, %v]", a, d, want/2, want)
		}
	}
	if d := New(nil, Options{}); d.opts.BackoffInitial != DefaultBackoffInitial || d.opts.BackoffMax != DefaultBackoffMax || d.opts.BackoffFactor != 2 {
		t.Errorf("defaults %v %v %v", d.opts.BackoffInitial, d.opts.BackoffMax, d.opts.BackoffFactor)
	}
	// The reference's XDS_CLIENT_BACKOFF_RANDOM_FACTOR default, 0.5, keeps
	// every wait at the initial one; 3 triples it.
	for _, tc := range []struct {
		factor float64
		want   []time.Duration
	}{
		{0.5, []time.Duration{time.Second, time.Second, time.Second}},
		{3, []time.Duration{time.Second, 3 * time.Second, 5 * time.Second}},
	} {
		c := New(nil, Options{BackoffInitial: time.Second, BackoffMax: 5 * time.Second, BackoffFactor: tc.factor})
		for a, want := range tc.want {
			if d := c.backoff(a); d != want {
				t.Errorf("factor %v, attempt %d: %v, want %v", tc.factor, a, d, want)
			}
		}
	}
}
