package app

import (
	"context"
	"errors"
	"fmt"
	"os"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/configsource"
	"github.com/slidingwindow/ratelimit/internal/settings"
	"github.com/slidingwindow/ratelimit/internal/tlsconfig"
)

// openSource opens the config source --config-type names: the config files
// (loaded at start, then watched with --watch-config) or an xDS server. A
// new source is a configsource.Source and one case here.
func openSource(ctx context.Context, s *settings.Settings, log *zap.Logger) (configsource.Source, error) {
	defaults, err := s.ConfigDefaults()
	if err != nil {
		return nil, err
	}
	switch s.XDS.ConfigType {
	case settings.ConfigTypeFile:
		if err := resolveConfigPath(s); err != nil {
			return nil, err
		}
		return &configsource.File{Path: s.ConfigPath, Defaults: defaults, Watch: s.WatchConfig, Log: log}, nil
	case settings.ConfigTypeXDS:
		return startXDS(ctx, s, log)
	}
	return nil, fmt.Errorf("--config-type: %q is not %s or %s", s.XDS.ConfigType, settings.ConfigTypeFile, settings.ConfigTypeXDS)
}

// defaultConfigEnv names the config path of last resort, below --config,
// RATELIMIT_CONFIG and envoyproxy/ratelimit's RUNTIME_* (the image sets it
// to its example rules).
const defaultConfigEnv = "RATELIMIT_DEFAULT_CONFIG"

func resolveConfigPath(s *settings.Settings) error {
	if s.ConfigPath == "" {
		s.ConfigPath = os.Getenv(defaultConfigEnv)
	}
	if s.ConfigPath == "" {
		return errors.New("--config is required (or envoyproxy/ratelimit's RUNTIME_ROOT)")
	}
	return nil
}

// startXDS starts the xDS client of validated settings (the table checks
// the xDS flags).
func startXDS(ctx context.Context, s *settings.Settings, log *zap.Logger) (*configsource.XDS, error) {
	x := &s.XDS
	defaults, err := s.ConfigDefaults()
	if err != nil {
		return nil, err
	}
	meta, err := x.NodeMetadataMap()
	if err != nil {
		return nil, err
	}
	headers, err := x.HeaderMap()
	if err != nil {
		return nil, err
	}
	opts := configsource.XDSOptions{
		ServerURL: x.ServerURL, NodeID: x.NodeID, NodeMetadata: meta, Headers: headers,
		BackoffInitial: x.BackoffInitial, BackoffMax: x.BackoffMax, BackoffFactor: x.BackoffFactor, BackoffJitter: x.BackoffJitter,
		MaxMsgSize: x.MaxMsgSize, ForceStart: x.ForceStart, Defaults: defaults, Log: log,
	}
	if x.TLS {
		// As the reference builds it: the CA (or the system roots), the
		// client certificate if any, and the name to check.
		opts.TLS, err = tlsconfig.NewClient(x.TLSCA, x.TLSCert, x.TLSKey, x.TLSSAN, func(err error) {
			log.Error("xDS client certificate did not reload: using the previous one", zap.Error(err))
		})
		if err != nil {
			return nil, fmt.Errorf("--xds-tls-*: %w", err)
		}
	}
	if s.ConfigPath != "" {
		// Envoy Gateway sets RUNTIME_ROOT beside CONFIG_TYPE; the
		// reference ignores it then, and so does this.
		log.Info("--config-type GRPC_XDS_SOTW: --config is not read", zap.String("config", s.ConfigPath))
	}
	src, err := configsource.StartXDS(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("--xds-server-url: %w", err)
	}
	return src, nil
}

// unconfigured makes ShouldRateLimit fail with UNAVAILABLE until src has
// given a config, which only a source started without one serves through
// (--force-start-without-initial-config): the reference answers an error
// then too, so that Envoy's failure_mode_deny decides, rather than admitting
// everything.
func unconfigured(src configsource.Source) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if info.FullMethod == rlsv3.RateLimitService_ShouldRateLimit_FullMethodName && !src.Configured() {
			return nil, status.Error(codes.Unavailable, "no rate limit config received over xDS yet")
		}
		return handler(ctx, req)
	}
}

// loadConfig reads the config files once, for ratelimit validate.
func loadConfig(s *settings.Settings) (*config.Config, error) {
	if err := resolveConfigPath(s); err != nil {
		return nil, err
	}
	defaults, err := s.ConfigDefaults()
	if err != nil {
		return nil, err
	}
	return (&configsource.File{Path: s.ConfigPath, Defaults: defaults}).Load()
}
