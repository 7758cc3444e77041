package dropdb

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// pgErr is an error with a SQLSTATE, as pgx's *pgconn.PgError.
type pgErr string

func (e pgErr) Error() string    { return "server error " + string(e) }
func (e pgErr) SQLState() string { return string(e) }

// script answers the statements Drop runs in turn, and records them.
type script struct {
	answers []error
	ran     []string
}

func (s *script) ExecContext(_ context.Context, q string, _ ...any) (sql.Result, error) {
	s.ran = append(s.ran, q)
	if len(s.answers) == 0 {
		return nil, nil
	}
	err := s.answers[0]
	s.answers = s.answers[1:]
	return nil, err
}

const (
	force = "DROP DATABASE IF EXISTS scratch_1 WITH (FORCE)"
	plain = "DROP DATABASE IF EXISTS scratch_1"
)

func TestDropMariaDBIsOneStatement(t *testing.T) {
	s := &script{}
	require.NoError(t, Drop(context.Background(), s, "scratch_1", false))
	require.Equal(t, []string{plain}, s.ran)
}

// FORCE refused because of an autovacuum worker: the plain DROP, which
// ends autovacuum workers itself, drops the database.
func TestDropPostgresFallsBackWhenForceMeetsAutovacuum(t *testing.T) {
	s := &script{answers: []error{pgErr(pgInsufficientPrivilege), nil}}
	require.NoError(t, Drop(context.Background(), s, "scratch_1", true))
	require.Equal(t, []string{force, plain}, s.ran)
}

// Both refused (a worker, then a session): Drop tries again until one
// goes through.
func TestDropPostgresTriesAgain(t *testing.T) {
	s := &script{answers: []error{pgErr(pgInsufficientPrivilege), pgErr(pgObjectInUse), nil}}
	require.NoError(t, Drop(context.Background(), s, "scratch_1", true))
	require.Equal(t, []string{force, plain, force}, s.ran)
}

// Any other error is final: it is returned at once, wrapped.
func TestDropReturnsOtherErrors(t *testing.T) {
	cause := pgErr("28000")
	s := &script{answers: []error{cause}}
	err := Drop(context.Background(), s, "scratch_1", true)
	require.ErrorIs(t, err, cause)
	require.ErrorContains(t, err, "dropdb: drop scratch_1")
	require.Equal(t, []string{force}, s.ran)

	down := errors.New("connection refused")
	s = &script{answers: []error{down}}
	require.ErrorIs(t, Drop(context.Background(), s, "scratch_1", false), down)
}

// Refused for as long as ctx lasts: the error says both why and that Drop
// gave up.
func TestDropGivesUpWithItsContext(t *testing.T) {
	s := &script{}
	for range 1000 {
		s.answers = append(s.answers, pgErr(pgObjectInUse))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*retryEvery)
	defer cancel()
	err := Drop(ctx, s, "scratch_1", true)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, pgErr(pgObjectInUse))
	require.GreaterOrEqual(t, len(s.ran), 4, "it tried again before giving up")
}

func TestDropRejectsNamesThatNeedQuoting(t *testing.T) {
	for _, name := range []string{"", "a b", "x; DROP TABLE y", "9lives", `a"b`, string(make([]byte, 64))} {
		s := &script{}
		require.ErrorContains(t, Drop(context.Background(), s, name, true), "invalid database name", name)
		require.Empty(t, s.ran, name)
	}
}
