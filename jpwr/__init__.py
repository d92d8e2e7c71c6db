"""jpwr: accelerator power and energy measurement, and the run record shared by every joulebench driver.

Drivers import the shared pieces from here (launch environment, window marks, run record,
validation errors); the sampler and its vendor backends live in the submodules.
"""

__version__ = "0.1.0"
