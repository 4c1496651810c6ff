package configsource

import (
	"context"
	"crypto/tls"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/xdsconfig"
)

// XDSOptions say where the xDS server is and how to subscribe. The caller
// validates them (internal/settings does, with the flags' names).
type XDSOptions struct {
	ServerURL    string
	NodeID       string
	NodeMetadata map[string]string
	// Headers are gRPC metadata sent with the stream.
	Headers map[string]string

	// TLS is the client's TLS to the server; nil: plaintext.
	TLS *tls.Config

	// The wait between stream attempts, as xdsconfig.Options.
	BackoffInitial, BackoffMax time.Duration
	BackoffFactor              float64
	BackoffJitter              bool
	// MaxMsgSize is the largest response accepted; 0: gRPC's default.
	MaxMsgSize int
	// ForceStart makes First return at once, with an empty config when
	// none has arrived, rather than wait for the first.
	ForceStart bool

	Defaults config.Defaults
	Log      *zap.Logger
}

// XDS is the config over xDS: a client that runs from StartXDS to Close,
// and hands each config it accepts to the sink once Follow gives one, keeping
// the latest until then.
type XDS struct {
	log      *zap.Logger
	defaults config.Defaults
	force    bool
	conn     *grpc.ClientConn
	stop     context.CancelFunc
	done     chan struct{}
	// configured turns true at the first config accepted.
	configured atomic.Bool

	mu     sync.Mutex
	sink   Sink
	latest *config.Config // the last config accepted before Follow
	given  *config.Config // the config First returned
	got    chan struct{}  // closed at the first config accepted
}

var _ Source = (*XDS)(nil)

// StartXDS connects to the server and subscribes, in the background until
// ctx ends or Close: the first config may arrive while the rest of the
// service starts.
func StartXDS(ctx context.Context, opts XDSOptions) (*XDS, error) {
	creds := insecure.NewCredentials()
	if opts.TLS != nil {
		creds = credentials.NewTLS(opts.TLS)
	}
	dial := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		// A stream that a silent partition cut would otherwise wait for
		// configs forever: pings end it, and the client opens another.
		// grpc-go servers refuse pings more often than every 5 minutes
		// (their default enforcement policy), and an idle stream is the
		// normal state of this one.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 5 * time.Minute, Timeout: 20 * time.Second, PermitWithoutStream: true}),
	}
	if opts.MaxMsgSize > 0 {
		dial = append(dial, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(opts.MaxMsgSize)))
	}
	conn, err := grpc.NewClient(opts.ServerURL, dial...)
	if err != nil {
		return nil, fmt.Errorf("xds client: %w", err)
	}
	fields := make(map[string]*structpb.Value, len(opts.NodeMetadata))
	for k, v := range opts.NodeMetadata {
		fields[k] = structpb.NewStringValue(v)
	}
	x := &XDS{log: opts.Log, defaults: opts.Defaults, force: opts.ForceStart, conn: conn,
		done: make(chan struct{}), got: make(chan struct{})}
	client := xdsconfig.New(conn, xdsconfig.Options{
		Node:           &corev3.Node{Id: opts.NodeID, Metadata: &structpb.Struct{Fields: fields}},
		Headers:        metadata.New(opts.Headers),
		Defaults:       opts.Defaults,
		OnConfig:       x.accepted,
		OnReject:       x.rejected,
		BackoffInitial: opts.BackoffInitial,
		BackoffMax:     opts.BackoffMax,
		BackoffFactor:  opts.BackoffFactor,
		Jitter:         opts.BackoffJitter,
		Logger:         opts.Log,
	})
	runCtx, stop := context.WithCancel(ctx)
	x.stop = stop
	go func() {
		defer close(x.done)
		client.Run(runCtx)
	}()
	opts.Log.Info("config over xDS", zap.String("server", opts.ServerURL), zap.String("node", opts.NodeID), zap.Bool("tls", opts.TLS != nil))
	return x, nil
}

// First returns the config to start with: the first one accepted, waited
// for unless ForceStart, which starts with the one accepted so far or an
// empty one. envoyproxy/ratelimit waits the same way, before it listens.
func (x *XDS) First(ctx context.Context) (*config.Config, error) {
	if !x.force {
		x.log.Info("waiting for the first config over xDS before serving")
		select {
		case <-x.got:
		case <-ctx.Done():
			x.log.Info("stopped before the first config over xDS")
			return nil, nil
		}
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.given = x.latest
	if x.given == nil {
		x.log.Warn("no config over xDS yet: rate limit calls fail with UNAVAILABLE until one arrives")
		var err error
		if x.given, err = config.ParseDocuments(nil, x.defaults); err != nil {
			return nil, err
		}
	}
	return x.given, nil
}

// Follow hands every later config to sink, and the one accepted since
// First if any, until ctx ends or Close.
func (x *XDS) Follow(ctx context.Context, sink Sink) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.sink = sink
	context.AfterFunc(ctx, func() {
		x.mu.Lock()
		defer x.mu.Unlock()
		x.sink = nil
	})
	if x.latest != nil && x.latest != x.given {
		sink.Reload(x.latest)
	}
	x.latest = nil
}

// Configured reports whether a config has arrived.
func (x *XDS) Configured() bool { return x.configured.Load() }

// accepted is the client's OnConfig: the config is in force when it
// returns, and the client then acknowledges it.
func (x *XDS) accepted(c *config.Config) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.configured.Store(true)
	// The server resends its config on each new stream: its warnings are
	// logged when it changed, as the file watcher does.
	if x.sink != nil {
		if x.sink.Reload(c) {
			logWarnings(x.log, c)
		}
		return
	}
	if x.latest == nil || x.latest.Hash() != c.Hash() {
		logWarnings(x.log, c)
	}
	x.latest = c
	select {
	case <-x.got:
	default:
		close(x.got)
	}
}

func (x *XDS) rejected(err error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.sink != nil {
		x.sink.ReloadFailed(err)
		return
	}
	x.log.Error("config over xDS refused: waiting for a good one", zap.Error(err))
}

// Close stops the client and closes its connection.
func (x *XDS) Close() error {
	x.stop()
	<-x.done
	return x.conn.Close()
}
