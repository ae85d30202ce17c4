# The dashboard's assets (dashboard/ui/) embedded in the binary: filled in by the assets work.
