// Package etcdlog gives the etcd client and server, which log through zap,
// a zap logger writing to log/slog.
package etcdlog

import (
	"context"
	"log/slog"
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// New gives the etcd client and server (which log through zap) a
// logger that writes to log. Their messages go one level down (warn to
// debug, error to warn): they are mostly retries that this package
// reports itself, with context, when they matter. While quiet is set (an
// embedded server shutting down, when failing accepts are expected) every
// message is debug.
func New(log *slog.Logger, quiet *atomic.Bool) *zap.Logger {
	if quiet == nil {
		quiet = new(atomic.Bool)
	}
	return zap.New(&slogCore{log: log, quiet: quiet})
}

// slogCore is a zapcore.Core writing to a slog.Logger.
type slogCore struct {
	log    *slog.Logger
	quiet  *atomic.Bool
	fields []zapcore.Field
}

func (c *slogCore) slogLevel(l zapcore.Level) slog.Level {
	switch {
	case c.quiet.Load():
		return slog.LevelDebug
	case l >= zapcore.ErrorLevel:
		return slog.LevelWarn
	case l >= zapcore.WarnLevel:
		return slog.LevelDebug
	default:
		// Info and debug chatter (elections, snapshots) below slog's debug.
		return slog.LevelDebug - 4
	}
}

func (c *slogCore) Enabled(l zapcore.Level) bool {
	return c.log.Enabled(context.Background(), c.slogLevel(l))
}

func (c *slogCore) With(fields []zapcore.Field) zapcore.Core {
	return &slogCore{log: c.log, quiet: c.quiet, fields: append(append([]zapcore.Field(nil), c.fields...), fields...)}
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fields {
		f.AddTo(enc)
	}
	attrs := make([]slog.Attr, 0, len(enc.Fields)+1)
	if e.LoggerName != "" {
		attrs = append(attrs, slog.String("logger", e.LoggerName))
	}
	for k, v := range enc.Fields {
		attrs = append(attrs, slog.Any(k, v))
	}
	c.log.LogAttrs(context.Background(), c.slogLevel(e.Level), "etcd: "+e.Message, attrs...)
	return nil
}

func (c *slogCore) Sync() error { return nil }
