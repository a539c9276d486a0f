"""Report writers: tables and plots of simulated runs."""
