-- Tests create one database per test, so the rmqtx user may create databases
-- (as scripts/services.sh grants on MariaDB).
GRANT ALL PRIVILEGES ON *.* TO 'rmqtx'@'%';
