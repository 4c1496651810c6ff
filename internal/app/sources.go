package app

import (
	"context"
	"errors"
	"fmt"
	"os"
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
	"github.com/slidingwindow/ratelimit/internal/settings"
	"github.com/slidingwindow/ratelimit/internal/tlsconfig"
	"github.com/slidingwindow/ratelimit/internal/xdsconfig"
)

// The config sources: the config files (loaded at start, then watched with
// --watch-config) or an xDS server (--config-type GRPC_XDS_SOTW). New
// starts one with startConfig and hands it the service with followConfig.

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
// xDS client and returns it, for New to take the first config from with
// first once the rest is ready.
func startConfig(ctx context.Context, s *settings.Settings, log *zap.Logger) (*config.Config, *xdsSource, error) {
	switch s.XDS.ConfigType {
	case settings.ConfigTypeFile:
		cfg, err := loadConfig(s)
		if err != nil {
			return nil, nil, err
		}
		log.Info("config loaded", zap.String("path", s.ConfigPath), zap.Int("rules", len(cfg.Rules())), zap.Strings("files", cfg.Files()))
		logWarnings(log, cfg)
		return cfg, nil, nil
	case settings.ConfigTypeXDS:
		x, err := startXDS(ctx, s, log)
		return nil, x, err
	}
	return nil, nil, fmt.Errorf("--config-type: %q is not %s or %s", s.XDS.ConfigType, settings.ConfigTypeFile, settings.ConfigTypeXDS)
}

// followConfig hands the configs that come after the first to svc: the
// xDS client's, or, with --watch-config, those of the config files, until
// ctx ends.
func followConfig(ctx context.Context, s *settings.Settings, log *zap.Logger, cfg *config.Config, xds *xdsSource, svc *service.Service) {
	if xds != nil {
		xds.attach(svc)
		return
	}
	if !s.WatchConfig {
		return
	}
	defaults := cfg.Defaults()
	go func() {
		err := config.Watch(ctx, s.ConfigPath, defaults, config.DefaultDebounce,
			func(c *config.Config) {
				if svc.Reload(c) {
					logWarnings(log, c)
				}
			}, svc.ReloadFailed)
		if err != nil {
			log.Error("config watch stopped: reloads need a restart", zap.Error(err))
		}
	}()
}

// defaultConfigEnv names the config path of last resort, below --config,
// RATELIMIT_CONFIG and envoyproxy/ratelimit's RUNTIME_* (the image sets it
// to its example rules).
const defaultConfigEnv = "RATELIMIT_DEFAULT_CONFIG"

func loadConfig(s *settings.Settings) (*config.Config, error) {
	if s.ConfigPath == "" {
		s.ConfigPath = os.Getenv(defaultConfigEnv)
	}
	if s.ConfigPath == "" {
		return nil, errors.New("--config is required (or envoyproxy/ratelimit's RUNTIME_ROOT)")
	}
	d, err := s.ConfigDefaults()
	if err != nil {
		return nil, err
	}
	return config.Load(s.ConfigPath, d)
}

// logWarnings logs what a config holds that loads but has no effect.
func logWarnings(log *zap.Logger, cfg *config.Config) {
	for _, w := range cfg.Warnings() {
		log.Warn("config: "+w, zap.String("hash", cfg.Hash()))
	}
}

// startXDS starts the xDS client of validated settings (the table checks
// the xDS flags).
func startXDS(ctx context.Context, s *settings.Settings, log *zap.Logger) (*xdsSource, error) {
	x := &s.XDS
	defaults, err := s.ConfigDefaults()
	if err != nil {
		return nil, err
	}
	meta, err := x.NodeMetadataMap()
	if err != nil {
		return nil, err
	}
	fields := make(map[string]*structpb.Value, len(meta))
	for k, v := range meta {
		fields[k] = structpb.NewStringValue(v)
	}
	headers, err := x.HeaderMap()
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
	if x.MaxMsgSize > 0 {
		opts = append(opts, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(x.MaxMsgSize)))
	}
	conn, err := grpc.NewClient(x.ServerURL, opts...)
	if err != nil {
		return nil, fmt.Errorf("--xds-server-url: %w", err)
	}
	if s.ConfigPath != "" {
		// Envoy Gateway sets RUNTIME_ROOT beside CONFIG_TYPE; the
		// reference ignores it then, and so does this.
		log.Info("--config-type GRPC_XDS_SOTW: --config is not read", zap.String("config", s.ConfigPath))
	}

	src := &xdsSource{log: log, defaults: defaults, force: x.ForceStart, conn: conn, done: make(chan struct{}), got: make(chan struct{})}
	client := xdsconfig.New(conn, xdsconfig.Options{
		Node:           &corev3.Node{Id: x.NodeID, Metadata: &structpb.Struct{Fields: fields}},
		Headers:        metadata.New(headers),
		Defaults:       defaults,
		OnConfig:       src.accepted,
		OnReject:       src.rejected,
		BackoffInitial: x.BackoffInitial,
		BackoffMax:     x.BackoffMax,
		BackoffFactor:  x.BackoffFactor,
		Jitter:         x.BackoffJitter,
		Logger:         log,
	})
	runCtx, stop := context.WithCancel(ctx)
	src.stop = stop
	go func() {
		defer close(src.done)
		client.Run(runCtx)
	}()
	log.Info("config over xDS", zap.String("server", x.ServerURL), zap.String("node", x.NodeID), zap.Bool("tls", x.TLS))
	return src, nil
}

// xdsCredentials are the transport credentials of the xDS connection, as
// the reference builds them: with --xds-tls, the CA (or the system roots),
// the client certificate if any, and the name to check.
func xdsCredentials(x *settings.XDS, log *zap.Logger) (credentials.TransportCredentials, error) {
	if !x.TLS {
		return insecure.NewCredentials(), nil
	}
	cfg, err := tlsconfig.NewClient(x.TLSCA, x.TLSCert, x.TLSKey, x.TLSSAN, func(err error) {
		log.Error("xDS client certificate did not reload: using the previous one", zap.Error(err))
	})
	if err != nil {
		return nil, fmt.Errorf("--xds-tls-*: %w", err)
	}
	return credentials.NewTLS(cfg), nil
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
