// Command rmqtx is the runbook CLI for rmqtx: see where an event is, what is
// stuck, list and replay dead letters, archive old rows, migrate the schema.
//
//	rmqtx migrate [--components txlog,outbox,consumer,replay]
//	rmqtx migrate --print --dialect mysql|postgres [--format golang-migrate|goose|atlas] [--out DIR]
//	rmqtx inspect <event-id> | rmqtx inspect --business-key K
//	rmqtx stuck [--older-than 1m]
//	rmqtx dead list [selectors] | rmqtx dead show <id>
//	rmqtx replay [selectors] --operator NAME --reason TEXT [--dry-run] [--rate 5] [--batch 10]
//	rmqtx archive [--dry-run] [--move]
//	rmqtx stats
//	rmqtx config
//	rmqtx topic create --name T [--queues 4] [--cluster C]
//
// Output is a table for humans, or JSON with --json. Payloads are hidden
// (sizes only) unless the operator opts out: --redact-prefix N shows the
// first N bytes, --show-payload everything; both are risky, since what is on
// the screen ends up in terminals' scrollback, tickets and chat.
//
// Configuration: --dsn or RMQTX_DSN, else RMQTX_MYSQL_ADDR / _USER /
// _PASSWORD / _DATABASE. The DSN's form picks the database: a
// postgres:// or postgresql:// URL, or a keyword/value string
// ("host=... dbname=..."), is PostgreSQL through pgx; anything else is a
// go-sql-driver/mysql DSN (user:password@tcp(host:port)/db).
// RMQTX_NAMESRV (comma separated, never defaulted), RMQTX_BROKER (optional
// broker addresses for lookups), RMQTX_TABLE_PREFIX.
// A flag wins over its variable. No password is ever printed: not by -h or
// a usage error (environment values are not flag defaults; help says only
// which variables are set), not by config (the DSN is masked), not in an
// error.
//
// Exit codes:
//
//	0  done, nothing needs attention
//	1  findings: stuck rows, PARKED dead letters, an event not found or not
//	   fully delivered, a replay that stopped or had failures
//	2  usage error (bad flags or arguments, missing configuration)
//	3  runtime error (database or broker unreachable, query failed)
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// Exit codes.
const (
	exitOK       = 0
	exitFindings = 1
	exitUsage    = 2
	exitRuntime  = 3
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usageText = `usage: rmqtx <command> [flags]

commands:
  migrate [--components L]      create or upgrade the rmqtx tables (all, or txlog,outbox,consumer,replay)
  migrate --print --dialect D   write them as SQL files for golang-migrate, goose or atlas (--format, --out DIR)
  inspect <event-id>            one event across txlog, outbox, consume log, dead letters, replays and the broker
  inspect --business-key K      the same for every event of a business key
  stuck [--older-than D]        outbox rows not sent, consumes being retried, parked dead letters, by age
  dead list [selectors]         dead letters
  dead show <id>                one dead letter
  replay [selectors]            re-publish parked dead letters (--dry-run, --rate, --batch, --reason, --operator)
  archive [--dry-run]           remove (or --move) terminal rows past retention
  stats                         row counts per table, status and group
  config                        the effective configuration (password masked)
  topic create --name T         create topic T on every master broker of the cluster (--queues N, --cluster C)

payloads are hidden (sizes only); --redact-prefix N or --show-payload show them (risky).
database: RMQTX_DSN (or --dsn), MySQL user:password@tcp(host:port)/db or
PostgreSQL postgres://user:password@host:port/db; else RMQTX_MYSQL_*.

run 'rmqtx <command> -h' for the flags of a command.
exit codes: 0 ok, 1 findings, 2 usage, 3 runtime error.
`

// run is main without the process: tests call it directly.
func run(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) int {
	sec := collectSecrets(args, env)
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, usageText)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	cmd, rest := args[0], args[1:]
	if strings.HasPrefix(cmd, "-") {
		// Not echoed: it may be --dsn=... or --mysql-password=...
		fmt.Fprintf(stderr, "rmqtx: the command comes first, its flags after it\n\n%s", usageText)
		return exitUsage
	}
	if sub, ok := withSubcommand[cmd]; ok {
		if len(rest) == 0 {
			fmt.Fprintf(stderr, "rmqtx: %s needs a subcommand: %s\n", cmd, sub)
			return exitUsage
		}
		cmd, rest = cmd+" "+rest[0], rest[1:]
	}
	c, ok := commands[cmd]
	if !ok {
		fmt.Fprintf(stderr, "rmqtx: unknown command %q\n\n%s", sec.scrub(cmd), usageText)
		return exitUsage
	}
	code, err := c(ctx, rest, env, stdout, stderr)
	if err != nil {
		if errors.Is(err, errHelp) {
			return exitOK // the flag package printed the help
		}
		fmt.Fprintf(stderr, "rmqtx %s: %s\n", cmd, sec.scrub(err.Error()))
		if errors.Is(err, errUsage) {
			return exitUsage
		}
		return exitRuntime
	}
	return code
}

type command func(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) (int, error)

var commands map[string]command

func init() {
	commands = map[string]command{
		"migrate":      cmdMigrate,
		"inspect":      cmdInspect,
		"stuck":        cmdStuck,
		"dead list":    cmdDeadList,
		"dead show":    cmdDeadShow,
		"replay":       cmdReplay,
		"archive":      cmdArchive,
		"stats":        cmdStats,
		"config":       cmdConfig,
		"topic create": cmdTopicCreate,
	}
}

// withSubcommand lists the commands that take a subcommand, with the list a
// usage error names.
var withSubcommand = map[string]string{"dead": "list or show", "topic": "create"}
