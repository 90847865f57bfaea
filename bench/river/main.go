// River draining N no-op jobs on the database DATABASE_URL points at, with
// CONCURRENCY workers; prints the jobs/s and the WAL per job as JSON on the
// last line. As bench/graphile/drain.mjs does for graphile-worker: the jobs
// are queued before the clock starts, the clock stops when the last job's
// work returns, and the WAL is counted from before the queueing to after the
// client stopped (its completions flushed). River keeps finished jobs (its
// cleaner deletes them a day later); that is its default and is kept.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

type noopArgs struct {
	N int `json:"n"`
}

func (noopArgs) Kind() string { return "noop" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
	left *atomic.Int64
	done chan struct{}
}

func (w *noopWorker) Work(ctx context.Context, job *river.Job[noopArgs]) error {
	if w.left.Add(-1) == 0 {
		close(w.done)
	}
	return nil
}

func main() {
	if err := drain(); err != nil {
		fmt.Fprintln(os.Stderr, "river:", err)
		os.Exit(1)
	}
}

func drain() error {
	ctx := context.Background()
	jobs := 5000
	if len(os.Args) > 1 {
		n, err := strconv.Atoi(os.Args[1])
		if err != nil || n < 1 {
			return fmt.Errorf("the job count %q is not a positive number", os.Args[1])
		}
		jobs = n
	}
	concurrency := 16
	if c, err := strconv.Atoi(os.Getenv("CONCURRENCY")); err == nil && c > 0 {
		concurrency = c
	}
	// River fetches at most MaxWorkers jobs per fetch and waits FetchCooldown
	// (100 ms by default) between fetches: with 16 workers its default caps
	// it at 160 jobs/s. FETCH_COOLDOWN_MS lowers the wait (1 ms at least).
	cooldown := river.FetchCooldownDefault
	if ms, err := strconv.Atoi(os.Getenv("FETCH_COOLDOWN_MS")); err == nil && ms > 0 {
		cooldown = time.Duration(ms) * time.Millisecond
	}
	config, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	config.MaxConns = int32(concurrency + 2)
	pool, err := pgxpool.NewWithConfig(ctx, config)
	if err != nil {
		return err
	}
	defer pool.Close()
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, nil)
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("migrating: %w", err)
	}

	left := &atomic.Int64{}
	left.Store(int64(jobs))
	worker := &noopWorker{left: left, done: make(chan struct{})}
	workers := river.NewWorkers()
	river.AddWorker(workers, worker)
	client, err := river.NewClient(driver, &river.Config{
		Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: concurrency}},
		Workers:       workers,
		FetchCooldown: cooldown,
		// Nothing per job on the console: printing would be most of the work.
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return err
	}

	var walStart string
	if err := pool.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&walStart); err != nil {
		return err
	}
	params := make([]river.InsertManyParams, jobs)
	for n := range params {
		params[n] = river.InsertManyParams{Args: noopArgs{N: n}}
	}
	if _, err := client.InsertManyFast(ctx, params); err != nil {
		return fmt.Errorf("queueing: %w", err)
	}
	started := time.Now()
	if err := client.Start(ctx); err != nil {
		return err
	}
	select {
	case <-worker.done:
	case <-time.After(10 * time.Minute):
		return fmt.Errorf("%d of %d jobs still not worked after 10 minutes", left.Load(), jobs)
	}
	seconds := time.Since(started).Seconds()
	if err := client.Stop(ctx); err != nil {
		return err
	}
	var walBytes float64
	if err := pool.QueryRow(ctx,
		"SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::float8", walStart,
	).Scan(&walBytes); err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"jobs":              jobs,
		"concurrency":       concurrency,
		"fetch_cooldown_ms": cooldown.Milliseconds(),
		"seconds":           seconds,
		"jobs_per_second":   float64(jobs) / seconds,
		"wal_bytes_per_job": walBytes / float64(jobs),
	})
}
