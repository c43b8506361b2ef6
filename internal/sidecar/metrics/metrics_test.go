package metrics

import (
	"errors"
	"fmt"
	"io"
	"os"
	"testing"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
)

// What redis_errors_total's kinds mean to an operator: a refused connection is told apart from
// a full pool, a slow Redis, a dead one and an error reply.
func TestRedisErrorKind(t *testing.T) {
	g := NewWithT(t)
	for err, want := range map[error]string{
		nil:                  "",
		redis.Nil:            "",
		redis.ErrPoolTimeout: RedisErrPoolTimeout,
		fmt.Errorf("running script: %w", redis.ErrPoolTimeout): RedisErrPoolTimeout,
		errors.New("ERR max number of clients reached"):        RedisErrMaxClients,
		os.ErrDeadlineExceeded:                                 RedisErrTimeout,
		io.EOF:                                                 RedisErrNetwork,
		redis.ErrClosed:                                        RedisErrNetwork,
	} {
		g.Expect(RedisErrorKind(err)).To(Equal(want), "%v", err)
	}
}
