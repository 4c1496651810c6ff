// Package xdsconfig receives the rate limit config over xDS, as Envoy
// Gateway and Envoy AI Gateway deliver it to envoyproxy/ratelimit
// (CONFIG_TYPE=GRPC_XDS_SOTW): a state-of-the-world subscription, on an
// aggregated discovery (ADS) stream, to
// ratelimit.config.ratelimit.v3.RateLimitConfig resources.
//
// Each response holds the whole config. The client builds it with the
// parser the files go through ([Build]); a config that builds is handed to
// the caller, then acknowledged (ACK); one that does not is refused (NACK)
// with the error as detail, and the config in force stays. A stream that
// ends is opened again after an exponential backoff.
package xdsconfig

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"go.uber.org/zap"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// The reference's backoff defaults (XDS_CLIENT_BACKOFF_INITIAL_INTERVAL,
// XDS_CLIENT_BACKOFF_MAX_INTERVAL).
const (
	DefaultBackoffInitial = 10 * time.Second
	DefaultBackoffMax     = 60 * time.Second
)

// Options configure a Client.
type Options struct {
	// Node identifies this client to the server, which picks the config
	// by it (Envoy Gateway: id "envoy-ratelimit").
	Node *corev3.Node
	// Headers are sent as gRPC metadata when each stream opens.
	Headers metadata.MD
	// Defaults are the parser's defaults, as for files.
	Defaults config.Defaults
	// OnConfig receives each config that builds, before it is
	// acknowledged: when it returns, the config must be in force. Called
	// from one goroutine at a time.
	OnConfig func(*config.Config)
	// OnReject receives the error of each config that does not build, and
	// is refused; may be nil.
	OnReject func(error)
	// BackoffInitial is the wait before the first new stream after one
	// ends; each failed attempt multiplies it by BackoffFactor, up to
	// BackoffMax. A stream that delivered a response starts over. Zero
	// means the defaults.
	BackoffInitial, BackoffMax time.Duration
	// BackoffFactor multiplies the wait at each failed attempt; zero means
	// 2. Below 1 the wait stays at BackoffInitial.
	BackoffFactor float64
	// Jitter draws each wait at random from its upper half, so that
	// replicas cut off together do not come back together.
	Jitter bool
	// Logger receives stream events; nil means none.
	Logger *zap.Logger
}

// Client subscribes to the rate limit config on one connection.
type Client struct {
	ads  discoveryv3.AggregatedDiscoveryServiceClient
	opts Options
	log  *zap.Logger

	// version is the version_info of the last config acknowledged, sent
	// again on a new stream so that the server resends only what changed
	// since. Only Run's goroutine touches it, as rejected.
	version string
	// rejected is the version_info of the last config refused.
	rejected string
}

// New returns a client speaking on conn, a connection to the xDS server.
// It does nothing until Run.
func New(conn grpc.ClientConnInterface, opts Options) *Client {
	if opts.BackoffInitial <= 0 {
		opts.BackoffInitial = DefaultBackoffInitial
	}
	if opts.BackoffMax <= 0 {
		opts.BackoffMax = DefaultBackoffMax
	}
	opts.BackoffMax = max(opts.BackoffMax, opts.BackoffInitial)
	if opts.BackoffFactor <= 0 {
		opts.BackoffFactor = 2
	}
	if opts.OnReject == nil {
		opts.OnReject = func(error) {}
	}
	c := &Client{ads: discoveryv3.NewAggregatedDiscoveryServiceClient(conn), opts: opts, log: opts.Logger}
	if c.log == nil {
		c.log = zap.NewNop()
	}
	return c
}

// Run keeps a subscription open until ctx ends, opening a new stream after
// a backoff whenever one ends.
func (c *Client) Run(ctx context.Context) {
	attempt := 0
	for {
		delivered, err := c.stream(ctx)
		if ctx.Err() != nil {
			return
		}
		if delivered {
			attempt = 0
		}
		wait := c.backoff(attempt)
		attempt++
		c.log.Warn("xDS config stream ended: opening a new one after a backoff",
			zap.Error(err), zap.Duration("backoff", wait), zap.Int("attempt", attempt))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// backoff returns the wait before attempt (0 for the first retry).
func (c *Client) backoff(attempt int) time.Duration {
	d := c.opts.BackoffMax
	if f := float64(c.opts.BackoffInitial) * math.Pow(c.opts.BackoffFactor, float64(attempt)); f < float64(d) {
		d = max(time.Duration(f), c.opts.BackoffInitial)
	}
	if c.opts.Jitter {
		d = d/2 + rand.N(d/2+1)
	}
	return d
}

// stream runs one ADS stream until it fails or ctx ends; delivered reports
// whether the server sent a response on it.
func (c *Client) stream(ctx context.Context) (delivered bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream whichever way this returns
	if len(c.opts.Headers) > 0 {
		ctx = metadata.NewOutgoingContext(ctx, c.opts.Headers)
	}
	st, err := c.ads.StreamAggregatedResources(ctx)
	if err != nil {
		return false, fmt.Errorf("open stream: %w", err)
	}
	// A wildcard subscription: no resource names, every config of the node.
	if err := st.Send(c.request("", nil)); err != nil {
		return false, fmt.Errorf("subscribe: %w", err)
	}
	c.log.Info("xDS config stream open: subscribed", zap.String("node", c.opts.Node.GetId()),
		zap.String("type", TypeURL), zap.String("version", c.version))
	for {
		resp, err := st.Recv()
		if err != nil {
			return delivered, err
		}
		delivered = true
		if resp.GetTypeUrl() != TypeURL {
			// Not asked for: an ADS server may only send subscribed types.
			c.log.Warn("xDS response of a type not subscribed: ignored", zap.String("type", resp.GetTypeUrl()))
			continue
		}
		cfg, err := Build(resp.GetResources(), c.opts.Defaults)
		if err != nil {
			err = fmt.Errorf("xDS config version %q: %w", resp.GetVersionInfo(), err)
			c.opts.OnReject(err)
			// A server that still holds the refused version sends it
			// again as soon as the NACK arrives (go-control-plane's
			// cache does): the NACK of a repeat waits BackoffInitial,
			// so that the two do not loop at network speed. The next
			// response is the server's newest config, a fix among them.
			if resp.GetVersionInfo() == c.rejected {
				t := time.NewTimer(c.opts.BackoffInitial)
				select {
				case <-ctx.Done():
					t.Stop()
					return delivered, ctx.Err()
				case <-t.C:
				}
			}
			c.rejected = resp.GetVersionInfo()
			// A NACK names the version still in force and carries the
			// reason; the server sees it in error_detail.
			detail := &status.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
			if err := st.Send(c.request(resp.GetNonce(), detail)); err != nil {
				return delivered, fmt.Errorf("send NACK: %w", err)
			}
			continue
		}
		c.opts.OnConfig(cfg)
		c.version = resp.GetVersionInfo()
		c.log.Info("xDS config accepted", zap.String("version", c.version), zap.Int("resources", len(resp.GetResources())),
			zap.Int("rules", len(cfg.Rules())), zap.String("hash", cfg.Hash()))
		if err := st.Send(c.request(resp.GetNonce(), nil)); err != nil {
			return delivered, fmt.Errorf("send ACK: %w", err)
		}
	}
}

// request is a discovery request: a subscription (no nonce), an ACK
// (nonce, no detail) or a NACK (nonce and detail). Its version is the last
// one accepted.
func (c *Client) request(nonce string, detail *status.Status) *discoveryv3.DiscoveryRequest {
	return &discoveryv3.DiscoveryRequest{
		Node:          c.opts.Node,
		VersionInfo:   c.version,
		TypeUrl:       TypeURL,
		ResponseNonce: nonce,
		ErrorDetail:   detail,
	}
}
