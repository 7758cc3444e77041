package main

import (
	"context"
	"fmt"
	"os"
	"syscall"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/proccpu"
)

// scaleBytesPerRow is what one preloaded N costs the database's disk: a
// row in each of the txlog, the outbox and the consume log (about 1.5 KB,
// 0.9 KB and 0.3 KB with their indexes, README's sizing table) and the redo
// or WAL beyond them: about 30 GB for a 10 M point (BENCHMARKS.md, "Scale").
const scaleBytesPerRow = 3000

// scaleDiskNeed is the free space a preload of rows needs.
func scaleDiskNeed(rows int64) uint64 { return uint64(rows) * scaleBytesPerRow }

// checkScaleDisk refuses a preload of rows when the file system of the
// database's data directory (the servers listen on loopback: the same
// machine) has less free space than it needs, so that a 10 M point fails
// at once with a clear error instead of filling the disk mid-load. When the
// data directory cannot be read (no privilege), it says so and lets the
// preload run.
func checkScaleDisk(ctx context.Context, db *sqlx.DB, engine, addr string, rows int64, logf func(string, ...any)) error {
	if rows <= 0 {
		return nil
	}
	dir, err := dataDir(ctx, db, engine, addr)
	if err != nil {
		logf("  free disk not checked: %v", err)
		return nil
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		logf("  free disk not checked: %s: %v", dir, err)
		return nil
	}
	return diskVerdict(rows, st.Bavail*uint64(st.Bsize), dir)
}

// dataDir finds the database's data directory: MariaDB names it
// (@@datadir); PostgreSQL shows it to privileged roles only, but its server
// runs in it, so the working directory of the process listening on addr is
// it.
func dataDir(ctx context.Context, db *sqlx.DB, engine, addr string) (string, error) {
	if engine != enginePostgres {
		var dir string
		if err := db.GetContext(ctx, &dir, "SELECT @@datadir"); err != nil {
			return "", fmt.Errorf("the data directory: %w", err)
		}
		return dir, nil
	}
	pid := proccpu.ListeningPID(addr)
	if pid <= 0 {
		return "", fmt.Errorf("no process of this machine listens on %s", addr)
	}
	dir, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	if err != nil {
		return "", fmt.Errorf("the data directory: %w", err)
	}
	return dir, nil
}

// diskVerdict is checkScaleDisk's decision for free bytes on dir.
func diskVerdict(rows int64, free uint64, dir string) error {
	if need := scaleDiskNeed(rows); free < need {
		return fmt.Errorf("preload of %s rows needs about %.1f GB free on the database's disk (%s), %.1f GB free: free space or choose fewer rows",
			fmtRows(rows), float64(need)/1e9, dir, float64(free)/1e9)
	}
	return nil
}
