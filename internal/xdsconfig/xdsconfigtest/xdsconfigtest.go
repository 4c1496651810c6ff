// Package xdsconfigtest runs a real xDS management server for tests:
// go-control-plane's server over its snapshot cache, the pieces Envoy
// Gateway serves the rate limit config with, on a free loopback port. It
// records every discovery request, so that a test sees ACKs and NACKs as the
// server does.
package xdsconfigtest

import (
	"context"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cachetypes "github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/slidingwindow/ratelimit/internal/waitfor"
)

// Server is an xDS server of a test. Stop and Restart simulate a control
// plane that goes away and comes back on the same address with the same
// snapshots.
type Server struct {
	// Addr is the host:port the server listens on.
	Addr string

	cache cachev3.SnapshotCache
	xds   serverv3.Server
	opts  []grpc.ServerOption

	mu       sync.Mutex
	grpc     *grpc.Server
	served   chan struct{}
	requests []Request
	// arrived is closed, and replaced, when a request is recorded: it
	// wakes WaitRequest.
	arrived chan struct{}
}

// Request is a discovery request the server received.
type Request struct {
	Stream int64 // the stream's number: a new stream, a new number
	*discoveryv3.DiscoveryRequest
}

// IsACK reports whether r acknowledges the response of version.
func (r Request) IsACK(version string) bool {
	return r.ResponseNonce != "" && r.ErrorDetail == nil && r.VersionInfo == version
}

// IsNACK reports whether r refuses a response while version stays in force.
func (r Request) IsNACK(version string) bool {
	return r.ResponseNonce != "" && r.ErrorDetail != nil && r.VersionInfo == version
}

// Start starts a server on a free loopback port with opts (TLS credentials,
// for one); it stops when the test ends.
func Start(t testing.TB, opts ...grpc.ServerOption) *Server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil), opts: opts, arrived: make(chan struct{})}
	s.xds = serverv3.NewServer(ctx, s.cache, serverv3.CallbackFuncs{
		StreamRequestFunc: func(id int64, req *discoveryv3.DiscoveryRequest) error {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.requests = append(s.requests, Request{Stream: id, DiscoveryRequest: req})
			close(s.arrived)
			s.arrived = make(chan struct{})
			return nil
		},
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.Addr = ln.Addr().String()
	s.serve(ln)
	t.Cleanup(func() {
		s.Stop()
		cancel()
	})
	return s
}

func (s *Server) serve(ln net.Listener) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.grpc = grpc.NewServer(s.opts...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(s.grpc, s.xds)
	s.served = make(chan struct{})
	go func(g *grpc.Server, done chan struct{}) {
		defer close(done)
		g.Serve(ln) //nolint:errcheck // Stop makes it return
	}(s.grpc, s.served)
}

// Stop stops the server and ends its streams; the snapshots stay for
// Restart.
func (s *Server) Stop() {
	s.mu.Lock()
	g, done := s.grpc, s.served
	s.grpc = nil
	s.mu.Unlock()
	if g != nil {
		g.Stop()
		<-done
	}
}

// Restart serves again on Addr after Stop. The port was free a moment ago;
// a test fails if something took it meanwhile.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	var ln net.Listener
	var err error
	// The old listener's socket may take a moment to go.
	waitfor.True(5*time.Second, 20*time.Millisecond, func() bool {
		ln, err = net.Listen("tcp", s.Addr)
		return err == nil
	})
	if err != nil {
		t.Fatal(err)
	}
	s.serve(ln)
}

// Set makes configs, at version, the state of the world of node.
func (s *Server) Set(t testing.TB, node, version string, configs ...*rlsconfv3.RateLimitConfig) {
	t.Helper()
	res := make([]cachetypes.Resource, len(configs))
	for i, c := range configs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resourcev3.Type][]cachetypes.Resource{resourcev3.RateLimitConfigType: res})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cache.SetSnapshot(context.Background(), node, snap); err != nil {
		t.Fatal(err)
	}
}

// Requests returns the requests received so far, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// WaitRequest waits up to timeout for a request that match accepts, and
// returns the first.
func (s *Server) WaitRequest(t testing.TB, timeout time.Duration, what string, match func(Request) bool) Request {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		i, arrived := slices.IndexFunc(s.requests, match), s.arrived
		var r Request
		if i >= 0 {
			r = s.requests[i]
		}
		s.mu.Unlock()
		if i >= 0 {
			return r
		}
		select {
		case <-arrived:
		case <-deadline.C:
			t.Fatalf("the xDS server saw no %s within %v; it saw %d requests", what, timeout, len(s.Requests()))
		}
	}
}

// Config returns a RateLimitConfig resource named name for domain, with one
// rule: descriptor key limited to n per unit.
func Config(name, domain, key string, n uint32, unit rlsconfv3.RateLimitUnit) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{Name: name, Domain: domain, Descriptors: []*rlsconfv3.RateLimitDescriptor{{
		Key:       key,
		RateLimit: &rlsconfv3.RateLimitPolicy{Unit: unit, RequestsPerUnit: n},
	}}}
}
