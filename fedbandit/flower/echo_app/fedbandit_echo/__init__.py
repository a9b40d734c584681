"""A bare Flower Message-API echo app (the yardstick of ``fedbandit bench deploy``)."""
