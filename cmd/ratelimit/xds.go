package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/service"
	"github.com/slidingwindow/ratelimit/internal/tlsconfig"
	"github.com/slidingwindow/ratelimit/internal/xdsconfig"
)

// The values of --config-type, the reference's CONFIG_TYPE.
const (
	configTypeFile = "FILE"
	configTypeXDS  = "GRPC_XDS_SOTW"
)

// xdsSettings are the flags of config over xDS. Each stands for one of
// envoyproxy/ratelimit's variables, named in its help.
type xdsSettings struct {
	configType                     string
	serverURL, nodeID, nodeMeta    string
	headers                        string
	tls                            bool
	tlsCert, tlsKey, tlsCA, tlsSAN string
	backoffInitial, backoffMax     time.Duration
	backoffFactor                  float64
	backoffJitter                  bool
	maxMsgSize                     int
	forceStart                     bool
}

func xdsFlags(fs *flag.FlagSet, x *xdsSettings) {
	fs.StringVar(&x.configType, "config-type", configTypeFile, "where the config comes from: FILE (--config) or GRPC_XDS_SOTW (an xDS server, --xds-server-url) (CONFIG_TYPE)")
	fs.StringVar(&x.serverURL, "xds-server-url", "localhost:18000", "host:port of the xDS server that serves RateLimitConfig resources (CONFIG_GRPC_XDS_SERVER_URL)")
	fs.StringVar(&x.nodeID, "xds-node-id", "default", "node id this service subscribes as; the server picks the config by it (CONFIG_GRPC_XDS_NODE_ID)")
	fs.StringVar(&x.nodeMeta, "xds-node-metadata", "", "node metadata sent to the xDS server: key=value,key2=value2 (CONFIG_GRPC_XDS_NODE_METADATA)")
	fs.StringVar(&x.headers, "xds-headers", "", "gRPC metadata sent with the xDS stream: key:value,key2:value2 (CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS)")
	fs.BoolVar(&x.tls, "xds-tls", false, "speak TLS to the xDS server (CONFIG_GRPC_XDS_SERVER_USE_TLS)")
	fs.StringVar(&x.tlsCert, "xds-tls-cert", "", "PEM client certificate presented to the xDS server, with --xds-tls-key (CONFIG_GRPC_XDS_CLIENT_TLS_CERT). Reloaded when the file changes")
	fs.StringVar(&x.tlsKey, "xds-tls-key", "", "PEM private key of --xds-tls-cert (CONFIG_GRPC_XDS_CLIENT_TLS_KEY). Reloaded when the file changes")
	fs.StringVar(&x.tlsCA, "xds-tls-ca", "", "PEM CA certificates for the xDS server's certificate, instead of the system roots (CONFIG_GRPC_XDS_SERVER_TLS_CACERT)")
	fs.StringVar(&x.tlsSAN, "xds-tls-san", "", "name the xDS server's certificate must hold, when not the --xds-server-url host (CONFIG_GRPC_XDS_SERVER_TLS_SAN)")
	fs.DurationVar(&x.backoffInitial, "xds-backoff-initial", xdsconfig.DefaultBackoffInitial, "wait before opening a new xDS stream after one ends; grows by --xds-backoff-factor with each failure (XDS_CLIENT_BACKOFF_INITIAL_INTERVAL)")
	fs.DurationVar(&x.backoffMax, "xds-backoff-max", xdsconfig.DefaultBackoffMax, "longest wait between xDS stream attempts (XDS_CLIENT_BACKOFF_MAX_INTERVAL)")
	fs.Float64Var(&x.backoffFactor, "xds-backoff-factor", 2, "multiplier of the xDS backoff wait at each failed attempt; below 1 the wait stays at --xds-backoff-initial (XDS_CLIENT_BACKOFF_RANDOM_FACTOR, whose default there, 0.5, does that)")
	fs.BoolVar(&x.backoffJitter, "xds-backoff-jitter", true, "draw each xDS backoff wait at random from its upper half (XDS_CLIENT_BACKOFF_JITTER)")
	fs.IntVar(&x.maxMsgSize, "xds-max-msg-size", 0, "largest xDS response accepted, in bytes; 0: gRPC's default, 4 MiB (XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES)")
	fs.BoolVar(&x.forceStart, "force-start-without-initial-config", false, "with GRPC_XDS_SOTW, listen at once instead of once the first config has arrived; until it does, rate limit calls fail with UNAVAILABLE (FORCE_START_WITHOUT_INITIAL_CONFIG)")
}

// xdsSource is the config over xDS: a client that runs from start to
// shutdown, and hands each config it accepts to the service once there is
// one, keeping the latest until then.
type xdsSource struct {
	log      *zap.Logger
	defaults config.Defaults
	force    bool
	conn     *grpc.ClientConn
	stop     context.CancelFunc
	done     chan struct{}
	// configured turns true at the first config accepted.
	configured atomic.Bool

	mu     sync.Mutex
	svc    *service.Service
	latest *config.Config // the last config accepted before attach
	given  *config.Config // the config first returned
	got    chan struct{}  // closed at the first config accepted
}

// startConfig starts the config source --config-type names. For FILE it
// loads --config and returns the config; for GRPC_XDS_SOTW it starts the
// xDS client and returns it, for serve to take the first config from with
// first once the rest is ready.
func startConfig(ctx context.Context, s *settings, log *zap.Logger) (*config.Config, *xdsSource, error) {
	switch s.xds.configType {
	case configTypeFile:
		cfg, err := loadConfig(s)
		if err != nil {
			return nil, nil, err
		}
		log.Info("config loaded", zap.String("path", s.configPath), zap.Int("rules", len(cfg.Rules())), zap.Strings("files", cfg.Files()))
		logWarnings(log, cfg)
		return cfg, nil, nil
	case configTypeXDS:
		x, err := startXDS(ctx, s, log)
		return nil, x, err
	}
	return nil, nil, fmt.Errorf("--config-type: %q is not %s or %s", s.xds.configType, configTypeFile, configTypeXDS)
}

func startXDS(ctx context.Context, s *settings, log *zap.Logger) (*xdsSource, error) {
	x := &s.xds
	defaults, err := configDefaults(s)
	if err != nil {
		return nil, err
	}
	if x.backoffInitial <= 0 || x.backoffMax < x.backoffInitial {
		return nil, fmt.Errorf("--xds-backoff-initial (%v) must be positive and --xds-backoff-max (%v) at least as long", x.backoffInitial, x.backoffMax)
	}
	if !(x.backoffFactor > 0) || math.IsInf(x.backoffFactor, 0) {
		return nil, fmt.Errorf("--xds-backoff-factor: %v is not a positive number", x.backoffFactor)
	}
	if x.maxMsgSize < 0 {
		return nil, fmt.Errorf("--xds-max-msg-size: %d is not a number of bytes", x.maxMsgSize)
	}
	if x.nodeID == "" {
		return nil, errors.New("--xds-node-id is empty")
	}
	meta, err := keyValues("--xds-node-metadata", x.nodeMeta, "=")
	if err != nil {
		return nil, err
	}
	fields := make(map[string]*structpb.Value, len(meta))
	for k, v := range meta {
		fields[k] = structpb.NewStringValue(v)
	}
	headers, err := keyValues("--xds-headers", x.headers, ":")
	if err != nil {
		return nil, err
	}
	creds, err := xdsCredentials(x, log)
	if err != nil {
		return nil, err
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		// A stream that a silent partition cut would otherwise wait for
		// configs forever: pings end it, and the client opens another.
		// grpc-go servers refuse pings more often than every 5 minutes
		// (their default enforcement policy), and an idle stream is the
		// normal state of this one.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 5 * time.Minute, Timeout: 20 * time.Second, PermitWithoutStream: true}),
	}
	if x.maxMsgSize > 0 {
		opts = append(opts, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(x.maxMsgSize)))
	}
	conn, err := grpc.NewClient(x.serverURL, opts...)
	if err != nil {
		return nil, fmt.Errorf("--xds-server-url: %w", err)
	}
	if s.configPath != "" {
		// Envoy Gateway sets RUNTIME_ROOT beside CONFIG_TYPE; the
		// reference ignores it then, and so does this.
		log.Info("--config-type GRPC_XDS_SOTW: --config is not read", zap.String("config", s.configPath))
	}

	src := &xdsSource{log: log, defaults: defaults, force: x.forceStart, conn: conn, done: make(chan struct{}), got: make(chan struct{})}
	client := xdsconfig.New(conn, xdsconfig.Options{
		Node:           &corev3.Node{Id: x.nodeID, Metadata: &structpb.Struct{Fields: fields}},
		Headers:        metadata.New(headers),
		Defaults:       defaults,
		OnConfig:       src.accepted,
		OnReject:       src.rejected,
		BackoffInitial: x.backoffInitial,
		BackoffMax:     x.backoffMax,
		BackoffFactor:  x.backoffFactor,
		Jitter:         x.backoffJitter,
		Logger:         log,
	})
	runCtx, stop := context.WithCancel(ctx)
	src.stop = stop
	go func() {
		defer close(src.done)
		client.Run(runCtx)
	}()
	log.Info("config over xDS", zap.String("server", x.serverURL), zap.String("node", x.nodeID), zap.Bool("tls", x.tls))
	return src, nil
}

// xdsCredentials are the transport credentials of the xDS connection, as
// the reference builds them: with --xds-tls, the CA (or the system roots),
// the client certificate if any, and the name to check.
func xdsCredentials(x *xdsSettings, log *zap.Logger) (credentials.TransportCredentials, error) {
	if !x.tls {
		if x.tlsCert != "" || x.tlsKey != "" || x.tlsCA != "" || x.tlsSAN != "" {
			return nil, errors.New("--xds-tls-* flags need --xds-tls")
		}
		return insecure.NewCredentials(), nil
	}
	if (x.tlsCert == "") != (x.tlsKey == "") {
		return nil, errors.New("--xds-tls-cert and --xds-tls-key go together: set both or neither")
	}
	cfg, err := tlsconfig.NewClient(x.tlsCA, x.tlsCert, x.tlsKey, x.tlsSAN, func(err error) {
		log.Error("xDS client certificate did not reload: using the previous one", zap.Error(err))
	})
	if err != nil {
		return nil, fmt.Errorf("--xds-tls-*: %w", err)
	}
	return credentials.NewTLS(cfg), nil
}

// keyValues parses "k1<sep>v1,k2<sep>v2"; empty gives none.
func keyValues(flagName, s, sep string) (map[string]string, error) {
	out := map[string]string{}
	if s == "" {
		return out, nil
	}
	for entry := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(entry, sep)
		if k = strings.TrimSpace(k); !ok || k == "" {
			return nil, fmt.Errorf("%s: %q is not key%svalue", flagName, entry, sep)
		}
		out[k] = strings.TrimSpace(v)
	}
	return out, nil
}

// first returns the config to start with: the first one accepted, waited
// for unless --force-start-without-initial-config, which starts with the
// one accepted so far or an empty one. The reference waits the same way,
// before it listens. It returns nil without error when ctx ends first.
func (x *xdsSource) first(ctx context.Context) (*config.Config, error) {
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

// interceptor makes ShouldRateLimit fail with UNAVAILABLE while no config
// has arrived, which only a --force-start-without-initial-config service
// serves through: the reference answers an error then too, so that Envoy's
// failure_mode_deny decides, rather than admitting everything. Nil (no
// interceptor) without xDS.
func (x *xdsSource) interceptor() grpc.UnaryServerInterceptor {
	if x == nil {
		return nil
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if info.FullMethod == rlsv3.RateLimitService_ShouldRateLimit_FullMethodName && !x.configured.Load() {
			return nil, status.Error(codes.Unavailable, "no rate limit config received over xDS yet")
		}
		return handler(ctx, req)
	}
}

// attach hands every later config to svc, and the one accepted since first
// if any.
func (x *xdsSource) attach(svc *service.Service) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.svc = svc
	if x.latest != nil && x.latest != x.given {
		svc.Reload(x.latest)
	}
	x.latest = nil
}

// accepted is the client's OnConfig: the config is in force when it
// returns, and the client then acknowledges it.
func (x *xdsSource) accepted(c *config.Config) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.configured.Store(true)
	// The server resends its config on each new stream: its warnings are
	// logged when it changed, as the file watcher does.
	if x.svc != nil {
		if x.svc.Reload(c) {
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

func (x *xdsSource) rejected(err error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.svc != nil {
		x.svc.ReloadFailed(err)
		return
	}
	x.log.Error("config over xDS refused: waiting for a good one", zap.Error(err))
}

// close stops the client and closes its connection; nil-safe.
func (x *xdsSource) close() {
	if x == nil {
		return
	}
	x.stop()
	<-x.done
	x.conn.Close()
}
