package app

import (
	"go.uber.org/zap"

	"github.com/slidingwindow/ratelimit/internal/metrics"
	"github.com/slidingwindow/ratelimit/internal/settings"
	"github.com/slidingwindow/ratelimit/internal/statsd"
)

// openStats makes the statsd sink of --statsd-addr: the reference's stats
// go there too, beside Prometheus. Without the flag, both are nil.
func openStats(s *settings.Settings, log *zap.Logger) (*statsd.Sender, metrics.Stats, error) {
	if s.StatsdAddr == "" {
		return nil, nil, nil
	}
	tags, err := s.StatsdTagMap()
	if err != nil {
		return nil, nil, err
	}
	sender, err := statsd.New(s.StatsdAddr, s.StatsdProtocol, s.StatsdFlushInterval, tags, log)
	if err != nil {
		return nil, nil, err
	}
	log.Info("statsd: the reference's stats go there too", zap.String("addr", s.StatsdAddr),
		zap.String("protocol", s.StatsdProtocol), zap.Duration("flush_interval", s.StatsdFlushInterval), zap.Any("tags", tags))
	return sender, sender, nil
}
