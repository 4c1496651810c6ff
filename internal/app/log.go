package app

import (
	"fmt"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/slidingwindow/ratelimit/internal/settings"
)

// newLogger builds the logger of validated settings (the table checks the
// level and the format).
func newLogger(s *settings.Settings) (*zap.Logger, error) {
	level, err := zapcore.ParseLevel(s.LogLevel)
	if err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	zc := zap.NewProductionConfig() // json
	if s.LogFormat == "console" {
		zc = zap.NewDevelopmentConfig()
		zc.DisableStacktrace = true // a warning is not a bug: keep the terminal readable
	}
	zc.Level = zap.NewAtomicLevelAt(level)
	// A client can make every request log (over-limit shadows, refused
	// costs): past 100 of one message per second, keep 1 in 100.
	zc.Sampling = &zap.SamplingConfig{Initial: 100, Thereafter: 100}
	return zc.Build()
}

// logEnv logs, once, what envoyproxy/ratelimit's environment did.
func logEnv(log *zap.Logger, p *settings.Plan) {
	if p == nil {
		return
	}
	for _, v := range p.Values {
		log.Info("from envoyproxy/ratelimit's environment", zap.String("flag", "--"+v.Flag), zap.String("from", v.From))
	}
	for _, n := range p.Notes {
		if n.Warn {
			log.Warn(n.Msg, zap.Strings("variables", n.Vars))
		} else {
			log.Info(n.Msg, zap.Strings("variables", n.Vars))
		}
	}
}
